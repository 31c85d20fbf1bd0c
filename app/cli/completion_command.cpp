// `tandem completion bash`: a bash completion script made from the command tree itself (every
// subcommand, its options and which options take a value), so it cannot drift from the CLI. The
// package installs its output as /usr/share/bash-completion/completions/tandem; from source:
// `source <(tandem completion bash)`.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/cli/commands.h"

namespace tandem::cli {

namespace {

struct CommandTable {
  std::string subcommands;     // per command path: `["tandem train"]="..."` lines
  std::string options;         // per command path: every --long and -s name
  std::string valued_options;  // per command path: the options followed by a value
};

void describe(const CLI::App& command, const std::string& path, CommandTable& table) {
  std::string subcommands, options, valued;
  for (const CLI::App* sub : command.get_subcommands({})) {
    if (sub->get_name().empty() || sub->get_group().empty()) continue;  // hidden
    subcommands += (subcommands.empty() ? "" : " ") + sub->get_name();
    describe(*sub, path + " " + sub->get_name(), table);
  }
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_group().empty() || option->get_positional()) continue;
    std::vector<std::string> names;
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
    for (const std::string& name : names) {
      options += (options.empty() ? "" : " ") + name;
      if (option->get_items_expected_min() > 0) valued += (valued.empty() ? "" : " ") + name;
    }
  }
  table.subcommands += "    [\"" + path + "\"]=\"" + subcommands + "\"\n";
  table.options += "    [\"" + path + "\"]=\"" + options + "\"\n";
  table.valued_options += "    [\"" + path + "\"]=\"" + valued + "\"\n";
}

std::string bashScript(const CLI::App& root) {
  CommandTable table;
  describe(root, "tandem", table);  // bash refuses an empty array key
  return "# bash completion for tandem; made by `tandem completion bash`\n"
         "_tandem() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} path=tandem i\n"
         "  local -A subcommands=(\n" +
         table.subcommands +
         "  )\n"
         "  local -A options=(\n" +
         table.options +
         "  )\n"
         "  local -A valued=(\n" +
         table.valued_options +
         "  )\n"
         "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
         "    [[ \" ${subcommands[$path]} \" == *\" ${COMP_WORDS[i]} \"* ]] && "
         "path=\"$path ${COMP_WORDS[i]}\"\n"
         "  done\n"
         "  if [[ \" ${valued[$path]} \" == *\" $prev \"* ]]; then\n"
         "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  elif [[ $cur == -* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"${options[$path]}\" -- \"$cur\"))\n"
         "  else\n"
         "    COMPREPLY=($(compgen -W \"${subcommands[$path]}\" -- \"$cur\"))\n"
         "    [ ${#COMPREPLY[@]} -eq 0 ] && COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  fi\n"
         "  return 0\n"
         "}\n"
         "complete -o filenames -F _tandem tandem\n";
}

}  // namespace

void addCompletionCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "completion", "Print a shell completion script (bash): source <(tandem completion bash)");
  auto shell = std::make_shared<std::string>("bash");
  cmd->add_option("shell", *shell, "Shell to complete for")->check(CLI::IsMember({"bash"}));
  cmd->callback([&app, shell] { std::fputs(bashScript(app).c_str(), stdout); });
}

}  // namespace tandem::cli
