"""`llmgw ctl scale MODEL N` / `--auto`: pin an elastic model's replica count, or give it back to its policy.

The pin holds between the model's ``min`` and ``max`` until the next reload
(``ctl reload`` or SIGHUP) or ``--auto``; a model with a fixed
``replicas: N`` is refused with the words to change it (docs/scaling.rst).
"""

from __future__ import annotations

from llmgw.answers import ScaleAnswer
from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.render import said


def add_parser(sub, run) -> None:
    scale = sub.add_parser("scale", help="pin an elastic model's replica count (until the next reload), or --auto")
    scale.add_argument("model", metavar="MODEL")
    scale.add_argument("count", metavar="N", type=int, nargs="?", help="replicas, between the model's min and max")
    scale.add_argument("--auto", action="store_true", help="give the model back to its scale: policy")
    scale.add_argument("--json", action="store_true", help="print the result as JSON")
    scale.set_defaults(func=run(cmd_scale))


def text(answer: ScaleAnswer) -> str:
    """"qwen: 2 replica(s) wanted (min 0, max 3), 1 ready; pinned at 2 until the next reload …"."""
    return (f"{said(answer.model)}: {answer.target} replica(s) wanted (min {answer.min}, max {answer.max}), "
            f"{answer.ready} ready; {said(answer.words)}")


async def cmd_scale(session, args) -> int:
    from llmgw.ctl.main import _print, decode

    if (args.count is None) == (not args.auto):
        raise LlmgwError("give a count (llmgw ctl scale MODEL N) or --auto, not both and not neither")
    if args.count is not None and args.count < 0:
        raise LlmgwError(f"{args.count} replicas: give 0 or more")
    answer = decode(ScaleAnswer, await session.call(uris.CP_SCALE, args.model, args.count), uris.CP_SCALE)
    return _print(args, answer, text)
