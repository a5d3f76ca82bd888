"""`racecheck list [SCENARIO] [--json]`: scenarios, their knobs, fix switches and variants."""
from __future__ import annotations

import json
import sys


def add_arguments(p) -> None:
    p.add_argument("scenario", nargs="?", default=None, help="show only this scenario")
    p.add_argument("--json", action="store_true", help="print the registry as JSON (for scripts)")


def main(args) -> int:
    from racecheck import scenarios

    names = [args.scenario] if args.scenario else scenarios.names()
    chosen = [scenarios.get(n) for n in names]
    if args.json:
        json.dump({"scenarios": [sc.to_json() for sc in chosen]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    overview = Table(title="scenarios", title_justify="left", show_lines=False)
    overview.add_column("scenario", style="bold", no_wrap=True)
    overview.add_column("description", overflow="fold")
    overview.add_column("variants", justify="right", overflow="fold")
    for sc in chosen:
        overview.add_row(sc.name, sc.description, str(len(sc.variants)))
    console.print(overview)

    for sc in chosen:
        knobs = Table(title=f"{sc.name}: knobs (--set KNOB=VALUE)", title_justify="left")
        knobs.add_column("knob", style="bold", no_wrap=True)
        knobs.add_column("default", overflow="fold")
        knobs.add_column("values", style="dim", overflow="fold")
        knobs.add_column("meaning", overflow="fold")
        for k in sc.knobs.values():
            if k.name in sc.switches:
                continue
            knobs.add_row(k.name, k.format(k.default), k.describe_type(), k.help)
        console.print(knobs)

        switches = Table(title=f"{sc.name}: fix switches (knobs, on by default)", title_justify="left")
        switches.add_column("switch", style="bold", no_wrap=True)
        switches.add_column("default", overflow="fold")
        switches.add_column("upstream", overflow="fold")
        switches.add_column("when off", overflow="fold")
        switches.add_column("what it does", overflow="fold")
        for name in sc.switches:
            s, k = sc.switch_info[name], sc.knobs[name]
            switches.add_row(name, k.format(k.default), s.upstream, f"{s.rule} on {s.tensor}", s.help)
        console.print(switches)

        variants = Table(title=f"{sc.name}: variants (--variant NAME)", title_justify="left")
        variants.add_column("variant", style="bold", no_wrap=True)
        variants.add_column("settings", overflow="fold")
        variants.add_column("expected", overflow="fold")
        variants.add_column("why", overflow="fold")
        for v in sc.variants.values():
            settings = ", ".join(f"{key}={sc.knobs[key].format(val)}" for key, val in v.overrides.items())
            expected = ", ".join(f"{rule} {tensor}" for rule, tensor in v.expected)
            variants.add_row(v.name, settings, expected, v.description)
        console.print(variants)
    return 0
