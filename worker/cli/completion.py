"""`conductor completion bash|zsh`: a shell completion script, generated from the parser itself.

The script knows every subcommand (at every level), each one's options, which options take a
value (so that value is skipped while finding the subcommand) and the choices of options and
positionals that have them. Anything else (a spec file, say) falls back to file names.
zsh runs the same function through its `bashcompinit`.

    eval "$(conductor completion bash)"    # in ~/.bashrc
    eval "$(conductor completion zsh)"     # in ~/.zshrc
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh")


def register(subparsers: argparse._SubParsersAction) -> None:
    completion = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description='Enable it with eval "$(conductor completion bash)" in ~/.bashrc '
        '(or eval "$(conductor completion zsh)" in ~/.zshrc).',
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    completion.set_defaults(func=run_completion)


def run_completion(args: argparse.Namespace) -> int:
    from worker.cli import build_parser  # the whole parser, this command included

    print(script(build_parser(), args.shell), end="")
    return 0


@dataclass
class Node:
    """One command level: `path` is the words after `conductor` ("" for the top)."""

    path: str
    subcommands: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    takes_value: list[str] = field(default_factory=list)
    option_choices: dict[str, list[str]] = field(default_factory=dict)
    positional_choices: list[str] = field(default_factory=list)


def walk(parser: argparse.ArgumentParser, path: str = "") -> list[Node]:
    """Every command level of `parser`, depth first, the top first."""
    node = Node(path)
    nodes = [node]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                node.subcommands.append(name)
                nodes += walk(child, f"{path} {name}".strip())
        elif action.option_strings:
            node.options += action.option_strings
            if action.nargs != 0:
                node.takes_value += action.option_strings
                if action.choices:
                    for option in action.option_strings:
                        node.option_choices[option] = [str(choice) for choice in action.choices]
        elif action.choices:
            node.positional_choices += [str(choice) for choice in action.choices]
    return nodes


def _words(items: list[str]) -> str:
    return shlex.quote(" ".join(items))


def bash_function(parser: argparse.ArgumentParser) -> str:
    nodes = walk(parser)
    subcommands = "\n".join(f"        {shlex.quote(n.path)}) echo {_words(n.subcommands)} ;;" for n in nodes if n.subcommands)
    options = "\n".join(f"        {shlex.quote(n.path)}) echo {_words(n.options)} ;;" for n in nodes if n.options)
    positionals = "\n".join(
        f"        {shlex.quote(n.path)}) echo {_words(n.positional_choices)} ;;" for n in nodes if n.positional_choices
    )
    valued = "\n".join(
        f"        {shlex.quote(n.path + '|' + option)}) return 0 ;;" for n in nodes for option in n.takes_value
    )
    choices = "\n".join(
        f"        {shlex.quote(n.path + '|' + option)}) echo {_words(values)} ;;"
        for n in nodes
        for option, values in n.option_choices.items()
    )
    return f"""# conductor completion, generated from its argument parser (conductor completion bash|zsh)
_conductor_subcommands() {{
    case "$1" in
{subcommands}
    esac
}}
_conductor_options() {{
    case "$1" in
{options}
    esac
}}
_conductor_positionals() {{
    case "$1" in
{positionals}
    esac
}}
_conductor_takes_value() {{
    case "$1|$2" in
{valued}
    esac
    return 1
}}
_conductor_option_choices() {{
    case "$1|$2" in
{choices}
    esac
}}
_conductor() {{
    [[ -n "${{ZSH_VERSION-}}" ]] && setopt local_options ksh_arrays
    local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" word prev="" i skip=0 found
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if ((skip)); then skip=0; continue; fi
        if [[ "$word" == -* ]]; then
            [[ "$word" != *=* ]] && _conductor_takes_value "$path" "$word" && skip=1
            continue
        fi
        found=0
        for sub in $(_conductor_subcommands "$path"); do
            [[ "$sub" == "$word" ]] && found=1 && break
        done
        ((found)) && path="${{path:+$path }}$word"
    done
    COMPREPLY=()
    if ((skip)); then
        prev="${{COMP_WORDS[COMP_CWORD-1]}}"
        COMPREPLY=($(compgen -W "$(_conductor_option_choices "$path" "$prev")" -- "$cur"))
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_conductor_options "$path")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_conductor_subcommands "$path") $(_conductor_positionals "$path")" -- "$cur"))
    fi
    return 0
}}
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    function = bash_function(parser)
    if shell == "bash":
        return function + "complete -o default -F _conductor conductor\n"
    return (
        "# zsh: the bash completion function, through zsh's bashcompinit\n"
        "autoload -U +X compinit && { (( ${+_comps} )) || compinit; }\n"
        "autoload -U +X bashcompinit && bashcompinit\n"
        + function
        + "complete -o default -F _conductor conductor\n"
    )
