#include "apps/ft/commands.h"
#include "core/error.h"
namespace ft::app {
int cmd_validate(const ValidateArgs&) { throw Error("ft validate: not implemented yet"); }
}  // namespace ft::app
