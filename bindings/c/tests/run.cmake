# run(COMMAND...): runs a command in a `cmake -P` test script and fails the
# test with its output when it fails.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(JOIN " " cmd ${ARGN})
    message(FATAL_ERROR "${cmd} failed (${rc}):\n${out}\n${err}")
  endif()
  if(out)
    message(STATUS "${out}")
  endif()
endfunction()
