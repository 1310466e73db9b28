// A fuzz driver runs one property family (tests/props/) for a time or case budget from a seed,
// through rapidcheck's checkProperty: batch after batch of `--batch` cases per property, batch r
// seeded with seed + r. On a failure it prints the batch seed and the commands that reproduce
// it, and writes the shrunk failing input under --out: its kernel cases as .safetensors files
// (each runs with `metrale case run`), or for scenario properties the kernel case of every
// launch the input makes, recorded by the emulator. docs/fuzzing.md says how to run campaigns.
#pragma once

#include <string>

namespace metrale::fuzz {

/// The command line of `fuzz_<family>`:
///   --seconds N | --cases N   budget (default: 10 seconds)
///   --seed S                  first batch seed (default: random, printed)
///   --batch B                 cases per property per batch (default 25)
///   --max-size N              rapidcheck's largest size (default 100)
///   --property NAME           only this property of the family
///   --out DIR                 where a failing input is written (default fuzz-failures)
///   --list                    print the family's properties and exit
/// Exit status: 0 no failure within the budget, 1 a property failed, 2 an error
/// (rapidcheck gave up, a bad argument).
int run(int argc, char** argv, const std::string& family);

}  // namespace metrale::fuzz
