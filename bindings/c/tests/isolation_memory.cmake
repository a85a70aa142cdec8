# Issue 33: a store, a machine key and an envelope made with the `keyfence`
# command line (found or built as remote.cmake does), then the C program
# that loads the key through its key process and searches its own
# memory for the machine key's secret.
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
keyfence_cli(cli)
run(${cli} authority init --store "${WORK}/store")
run(${cli} authority issue --store "${WORK}/store" --attrs "country=US,region=NA" --out "${WORK}/m.machine")
run(openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "${WORK}/key.pem")
run(${cli} authority wrap --store "${WORK}/store" --policy "country: US" --in "${WORK}/key.pem" --out "${WORK}/key.env")
run("${TEST}" "${KEY_PROCESS}" "${WORK}/store" "${WORK}/m.machine" "${WORK}/key.env")
