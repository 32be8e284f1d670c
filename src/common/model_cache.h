#pragma once
// Where scripts/fetch_models.sh keeps the real models: $SPECULA_MODEL_CACHE, else
// ~/.cache/specula/models (the script uses the same variable and default).
#include <cstdlib>
#include <string>

namespace specula {

inline std::string model_cache_dir() {
    if (const char * dir = std::getenv("SPECULA_MODEL_CACHE"); dir && *dir) return dir;
    const char * home = std::getenv("HOME");
    return std::string(home ? home : "") + "/.cache/specula/models";
}

}  // namespace specula
