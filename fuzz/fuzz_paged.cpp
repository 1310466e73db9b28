// fuzz_paged: the paged property family of tests/props/ for a budget from a seed (fuzz/driver.hpp).
#include "driver.hpp"

int main(int argc, char** argv) { return metrale::fuzz::run(argc, argv, "paged"); }
