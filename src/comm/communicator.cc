#include "comm/communicator.h"

namespace fathom {

Communicator& SingleRank() {
  static SingleRankCommunicator comm;
  return comm;
}

}  // namespace fathom
