"""Shell completion: `gpuq completion bash|zsh` prints a script made from the argument parser
itself (so it never drifts from the verbs and options); job ids come from `gpuq _ids PREFIX`,
which lists names in the spool without parsing anything; hosts from `gpuq _hosts`."""

from __future__ import annotations

import argparse
import difflib
import os

from gpuq.cli.common import open_layout, verbs_of
from gpuq.spool.layout import Layout

ID_VERBS = ("show", "logs", "cancel", "wait", "hold", "release", "retry", "edit")
HOST_VERBS = ("drain", "resume", "forget")
MAX_IDS = 200


def did_you_mean(layout: Layout, job_id: str) -> str:
    """The nearest known ids to one that is no job's, as "; did you mean X or Y?" (or "")."""
    near = difflib.get_close_matches(job_id, job_ids(layout, "", limit=None), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(near)}?" if near else ""


def job_ids(layout: Layout, prefix: str, limit: int | None = MAX_IDS) -> list[str]:
    """Ids starting with `prefix`: pending, held, running, groups, then finished (at most
    `limit`; a queue with 100,000 finished jobs completes as fast as an empty one)."""
    found: list[str] = []
    for directory, suffixes in (
        (layout.jobs, (".yaml", ".yml")),
        (layout.held, (".yaml",)),
        (layout.running, (".json",)),
        (layout.groups, (".json",)),
        (layout.finished, (".json",)),
    ):
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    name = entry.name
                    if name.startswith(prefix) and not name.startswith(".") and name.endswith(suffixes):
                        found.append(name.rsplit(".", 1)[0])
                        if limit is not None and len(found) >= limit:
                            return sorted(set(found))
        except OSError:
            continue
    return sorted(set(found))


def host_names(layout: Layout) -> list[str]:
    return sorted(p.stem for p in layout.workers.glob("*.json") if not p.name.endswith(".specs.json"))


def _verbs(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    sub = verbs_of(parser)
    return {
        name: sorted(o for a in sp._actions for o in a.option_strings)
        for name, sp in sub.choices.items()
        if not name.startswith("_")
    }


def bash_script(parser: argparse.ArgumentParser) -> str:
    verbs = _verbs(parser)
    cases = "\n".join(f'            {name}) opts="{" ".join(opts)}" ;;' for name, opts in verbs.items())
    return f"""# gpuq completion for bash: eval "$(gpuq completion bash)" (e.g. in ~/.bashrc)
_gpuq() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" verb="" root=() i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        if [[ "$w" == --root ]]; then root=(--root "${{COMP_WORDS[i+1]}}"); ((i++)); continue; fi
        [[ "$w" == -* ]] && continue
        verb="$w"; break
    done
    if [[ -z "$verb" ]]; then
        COMPREPLY=($(compgen -W "{" ".join(verbs)} --root --help" -- "$cur")); return
    fi
    if [[ "$cur" == -* ]]; then
        local opts=""
        case "$verb" in
{cases}
        esac
        COMPREPLY=($(compgen -W "$opts" -- "$cur")); return
    fi
    case "$verb" in
        {"|".join(ID_VERBS)}) COMPREPLY=($(gpuq "${{root[@]}}" _ids "$cur" 2>/dev/null)) ;;
        {"|".join(HOST_VERBS)}) COMPREPLY=($(compgen -W "$(gpuq "${{root[@]}}" _hosts 2>/dev/null)" -- "$cur")) ;;
        completion) COMPREPLY=($(compgen -W "bash zsh" -- "$cur")) ;;
        *) COMPREPLY=($(compgen -f -- "$cur")) ;;
    esac
}}
complete -F _gpuq gpuq
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return (
        '# gpuq completion for zsh: eval "$(gpuq completion zsh)" (e.g. in ~/.zshrc)\n'
        "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n"
        + bash_script(parser).split("\n", 1)[1]
    )


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    return bash_script(parser) if shell == "bash" else zsh_script(parser)


def cmd_completion(args: argparse.Namespace) -> int:
    """`gpuq completion bash|zsh`, and the hidden `gpuq _ids PREFIX` / `gpuq _hosts` it calls."""
    if args.verb == "completion":
        print(script(args.shell, args.parser), end="")
        return 0
    layout = open_layout(args)
    print("\n".join(job_ids(layout, args.prefix) if args.verb == "_ids" else host_names(layout)))
    return 0
