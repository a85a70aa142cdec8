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

# keyfence_cli(VAR): the `keyfence` command line in VAR: the one ./x test
# passes (KEYFENCE_CLI, what `cargo test` built), else built here. Needs
# CARGO, CARGO_TARGET_DIR and SOURCE_DIR; cargo is told the manifest,
# because ctest runs from the build directory, which may be anywhere.
function(keyfence_cli var)
  if(DEFINED ENV{KEYFENCE_CLI} AND EXISTS "$ENV{KEYFENCE_CLI}")
    set(${var} "$ENV{KEYFENCE_CLI}" PARENT_SCOPE)
  else()
    run(${CMAKE_COMMAND} -E env "CARGO_TARGET_DIR=${CARGO_TARGET_DIR}" ${CARGO} build --locked -q
        --manifest-path "${SOURCE_DIR}/Cargo.toml" -p keyfence-cli --bin keyfence)
    set(${var} "${CARGO_TARGET_DIR}/debug/keyfence" PARENT_SCOPE)
  endif()
endfunction()
