# The remote-signing test: finds or builds the `keyfence` command line, starts a key
# server with vectors/remote-fixture.sh in a fresh directory, runs the C
# program against it, and kills the server whatever happened.
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)
file(REMOVE_RECURSE "${WORK}")
keyfence_cli(cli)
run(bash "${SOURCE_DIR}/vectors/remote-fixture.sh" "${cli}" "${WORK}")
execute_process(COMMAND "${TEST}" "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ "${WORK}/server.pid" pid)
string(STRIP "${pid}" pid)
execute_process(COMMAND kill -9 ${pid} ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TEST} failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "${out}")
