# The etcd store test: starts a three-member cluster on loopback with
# vectors/etcd-fixture.sh in a fresh directory, runs the C program on an
# etcd:// store name, and kills the members (by process group) whatever
# happened. Without etcd it prints SKIPPED (SKIP_REGULAR_EXPRESSION).
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND bash "${SOURCE_DIR}/vectors/etcd-fixture.sh" "${WORK}" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 77)
  message(STATUS "SKIPPED: ${err}")
  return()
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "the etcd fixture failed (${rc}):\n${err}")
endif()
file(READ "${WORK}/endpoints" endpoints)
string(STRIP "${endpoints}" endpoints)
execute_process(COMMAND "${TEST}" "etcd://${endpoints}/c-test" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(STRINGS "${WORK}/pids" groups)
foreach(g IN LISTS groups)
  execute_process(COMMAND kill -9 -- -${g} ERROR_QUIET)
endforeach()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TEST} failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "${out}")
