#pragma once
// The one exception type for every user-facing failure (bad options, bad files, bad input): its
// message is the one line the CLI prints.
#include <stdexcept>
#include <string>

namespace specula {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace specula
