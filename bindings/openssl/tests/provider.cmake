# Keys from the `keyfence` command line (make_keys.sh), then test_provider
# with the keys in this process and again in the isolated key process.
include(${SOURCE_DIR}/bindings/c/tests/run.cmake)
file(REMOVE_RECURSE "${WORK}")
keyfence_cli(cli)
run(bash "${SOURCE_DIR}/bindings/openssl/tests/make_keys.sh" "${cli}" "${WORK}")
run("${TEST}" "${MODULES}" "${WORK}")
execute_process(COMMAND "${cli}" provider-config --module "${MODULES}/keyfence.so" --isolated
  OUTPUT_FILE "${WORK}/isolated.cnf" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "keyfence provider-config failed (${rc})")
endif()
run("${TEST}" "${MODULES}" "${WORK}" "${WORK}/isolated.cnf")
