#pragma once
// A directory Tandem made and whose contents it can name (a training output dir, the demo's model
// dir): the artefacts it writes there, as exact names or patterns whose <...> parts stand for
// digits ("checkpoint-<N>"). Whatever else is in such a dir is the user's: Tandem removes the
// dir's contents only when these helpers find nothing else, and names what they found otherwise.

#include <filesystem>
#include <string>
#include <vector>

namespace tandem::io {

// Whether `name` is one of `artefacts`: equal to a name, or to a pattern with each <...> part
// matched by 1-18 digits.
bool isListedArtefact(const std::string& name, const std::vector<std::string>& artefacts);

// The entries of `dir`, sorted, that `artefacts` does not list; a listed name that is a symlink
// counts as unlisted too (it could point anywhere, Tandem never makes one).
std::vector<std::string> unlistedEntries(const std::filesystem::path& dir,
                                         const std::vector<std::string>& artefacts);

// "a, b, c and 4 more": at most 8 names, for a message.
std::string nameList(const std::vector<std::string>& names);

}  // namespace tandem::io
