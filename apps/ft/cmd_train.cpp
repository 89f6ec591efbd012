#include "apps/ft/commands.h"
#include "core/error.h"
namespace ft::app {
int cmd_train(const TrainArgs&) { throw Error("ft train: not implemented yet"); }
}  // namespace ft::app
