# servers.sh with the `keyfence` command line found or built as the C
# tests do (run.cmake).
include(${SOURCE_DIR}/bindings/c/tests/run.cmake)
keyfence_cli(cli)
run(bash "${SOURCE_DIR}/bindings/openssl/tests/servers.sh" "${cli}" "${MODULES}" "${WORK}")
