# The PKCS#11 test: a SoftHSM2 token made with vectors/softhsm-fixture.sh
# in a fresh directory, then the C program with the fixture's environment
# (DIR/env: SOFTHSM2_CONF, read once per process, and the module and PIN
# file). Without SoftHSM2 it prints SKIPPED (SKIP_REGULAR_EXPRESSION),
# unless KEYFENCE_REQUIRE_SERVERS is set: then the fixture fails.
include("${CMAKE_CURRENT_LIST_DIR}/fixture.cmake")
kf_fixture(softhsm-fixture.sh SoftHSM2)
file(STRINGS "${WORK}/env" env)
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} "${TEST}" "${WORK}" "${KEY_PROCESS}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
kf_verdict()
