#include "apps/ft/commands.h"
#include "core/error.h"
namespace ft::app {
int cmd_tokenize(const TokenizeArgs&) { throw Error("ft tokenize: not implemented yet"); }
}  // namespace ft::app
