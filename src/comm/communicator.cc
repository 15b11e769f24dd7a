#include "comm/communicator.h"

#include <cstdlib>

namespace fathom {

Communicator& SingleRank() {
  static SingleRankCommunicator comm;
  return comm;
}

bool LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) > 1) return true;
  }
  return false;
}

int64_t LaunchedRank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return std::atoll(v);
  }
  return 0;
}

}  // namespace fathom
