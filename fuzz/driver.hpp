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
///   --seconds N | --cases N   budget (default: 10 seconds; at most 1e7 s, 2^40 cases)
///   --seed S                  first batch seed, 0 ≤ S < 2^64 (default: random, printed)
///   --batch B                 cases per property per batch, 1–1000 (default 25)
///   --max-size N              rapidcheck's largest size, 0–1000 (default 100)
///   --property NAME           only this property of the family
///   --out DIR                 where a failing input is written (default fuzz-failures),
///                             created and checked before the first case
///   --list                    print the family's properties and exit
/// The budget is checked between batches once every property has run one, so a run ends at most
/// one batch late (or a round of one batch per property, when the budget is smaller than that).
/// A run without a failure removes the --out folders it created.
/// Exit status: 0 no failure within the budget, 1 a property failed, 2 an error
/// (rapidcheck gave up, a bad argument, --out not writable).
int run(int argc, char** argv, const std::string& family);

}  // namespace metrale::fuzz
