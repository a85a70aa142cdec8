# What the fixture-driven C tests (etcd.cmake, pkcs11.cmake) share, run
# with `cmake -P`: a fixture script that prepares WORK, and the verdict on
# the test program's run.

# Runs vectors/SCRIPT in a fresh WORK. Exit 77 (what it needs is not
# installed) prints SKIPPED, which SKIP_REGULAR_EXPRESSION reports, and ends
# the calling script (a macro's return() is its caller's); any other failure
# fails the test, saying which fixture.
macro(kf_fixture script what)
  file(REMOVE_RECURSE "${WORK}")
  execute_process(COMMAND bash "${SOURCE_DIR}/vectors/${script}" "${WORK}" RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc EQUAL 77)
    message(STATUS "SKIPPED: ${err}")
    return()
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "the ${what} fixture failed (${rc}):\n${err}")
  endif()
endmacro()

# The test program's run (rc, out, err) passes or fails the test.
macro(kf_verdict)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TEST} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endmacro()
