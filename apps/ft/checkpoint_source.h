// What ft generate and ft export take as a checkpoint (DESIGN.md §4 CHECKPOINT): a step folder,
// or a checkpoint dir, which means the step folder its `latest` names, or without `latest` the
// newest complete one (as --resume auto). One resolution for both commands, so that a dir whose
// `latest` names a folder that is gone is reported as such, with what to give instead.
#pragma once

#include <string>

namespace ft::app {

// The step folder name `dir`/latest holds ("step_00000100"), or "" without `latest`. Read
// bounded (a FIFO or device in its place is refused at once); whether that folder is there is
// not checked. Throws UsageError for a `latest` that is not a small regular file or does not
// hold a step folder name.
std::string latest_step_name(const std::string& dir);

// Whether `dir` looks like a checkpoint: it holds manifest.json, `latest` or step_* folders.
bool is_checkpoint_path(const std::string& dir);

// The complete step folder `dir` stands for. `verb` names the command's use in messages
// ("export", "generate from"). When the choice needs saying (no `latest`: the newest complete
// step folder was taken), *note gets a line for the user. Throws UsageError (exit 2) for a
// `latest` that is not a small regular file, does not name a step folder, or names one that is
// not there; Error (exit 1) for a step folder without manifest.json or COMPLETE (a save that
// never finished) and for a dir whose step folders are all incomplete.
std::string resolve_checkpoint(const std::string& dir, const std::string& verb, std::string* note);

}  // namespace ft::app
