"""One step's StepOutput, split by the client that owns each request (the engine process
sends every client only its own part, one message per step).

With one client owning everything the step holds (one front: the usual case) the step
goes as it is, with no copy. A finished request leaves `owner_of` here: its end is the
last thing its client hears of it.
"""
from __future__ import annotations

from engine.outputs import StepOutput


def split_by_client(out: StepOutput, owner_of: dict[str, bytes]) -> list[tuple[bytes, StepOutput]]:
    owners = list(map(owner_of.get, out.request_ids))
    prompt_owners = {rid: owner_of.get(rid) for rid in out.prompt_logprobs or ()}
    finished_owners = [owner_of.pop(f.request_id, None) for f in out.finished]
    everyone = {*owners, *prompt_owners.values(), *finished_owners}
    if len(everyone) == 1 and None not in everyone:
        return [(everyone.pop(), out)]
    per: dict[bytes, StepOutput] = {}

    def part(client: bytes) -> StepOutput:
        msg = per.get(client)
        if msg is None:
            msg = per[client] = StepOutput(out.time, [], [], [])
        return msg
    for client, rid, tok in zip(owners, out.request_ids, out.token_ids):
        if client is not None:
            msg = part(client)
            msg.request_ids.append(rid)
            msg.token_ids.append(tok)
    if out.logprobs is not None:     # parallel to each part's tokens
        for msg in per.values():
            msg.logprobs = []
        for client, lp in zip(owners, out.logprobs):
            if client is not None:
                per[client].logprobs.append(lp)
    for rid, client in prompt_owners.items():
        if client is not None:
            msg = part(client)
            msg.prompt_logprobs = {**(msg.prompt_logprobs or {}), rid: out.prompt_logprobs[rid]}
    for client, fin in zip(finished_owners, out.finished):
        if client is not None:
            part(client).finished.append(fin)
    return list(per.items())
