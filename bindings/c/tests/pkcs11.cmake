# The PKCS#11 test: a SoftHSM2 token made with vectors/softhsm-fixture.sh
# in a fresh directory, then the C program with the fixture's environment
# (DIR/env: SOFTHSM2_CONF, read once per process, and the module and PIN
# file). Without SoftHSM2 it prints SKIPPED (SKIP_REGULAR_EXPRESSION),
# unless KEYFENCE_REQUIRE_SERVERS is set: then the fixture fails.
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND bash "${SOURCE_DIR}/vectors/softhsm-fixture.sh" "${WORK}" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 77)
  message(STATUS "SKIPPED: ${err}")
  return()
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "the SoftHSM2 fixture failed (${rc}):\n${err}")
endif()
file(STRINGS "${WORK}/env" env)
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} "${TEST}" "${WORK}" "${KEY_PROCESS}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TEST} failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "${out}")
