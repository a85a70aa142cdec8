# SCRIPT (a bash script of this folder) with the `keyfence` command line,
# the provider's module folder MODULES and a scratch folder WORK.
include(${SOURCE_DIR}/bindings/c/tests/run.cmake)
keyfence_cli(cli)
run(bash "${SOURCE_DIR}/bindings/openssl/tests/${SCRIPT}" "${cli}" "${MODULES}" "${WORK}")
