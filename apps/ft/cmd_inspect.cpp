#include "apps/ft/commands.h"
#include "core/error.h"
namespace ft::app {
int cmd_inspect(const InspectArgs&) { throw Error("ft inspect: not implemented yet"); }
}  // namespace ft::app
