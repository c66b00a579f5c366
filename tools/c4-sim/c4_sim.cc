// c4-sim: predicts how long a collective's schedules take on a fabric (docs/c4-sim.md). Builds every
// rank's schedule (a built-in algorithm or a schedule file), places the lanes between hosts as C4P
// plans them (or as ECMP hashing does), and simulates the messages in time: alpha-beta per message,
// links shared max-min fairly by the transfers crossing them. Prints time, algbw, busbw and the
// most loaded link per algorithm and size; `c4-sim check FILE.json` only checks a schedule file.
#include "sim/sim_cli.hpp"

int main(int argc, char** argv) { return c4::sim::cliMain(argc, argv); }
