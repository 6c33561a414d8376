"""split_by_client: each client gets exactly its requests' tokens, logprobs, prompt
logprobs and ends, in step order; one owner of everything gets the step as it is;
requests nobody owns (refused, or their client gone) go nowhere."""
from engine.ipc.output_split import split_by_client
from engine.outputs import FinishedRequest, StepOutput, TokenLogprobs


def fin(rid):
    return FinishedRequest(rid, "length", None, 1.0, 0, 0)


def lp(t):
    return TokenLogprobs([t], [-0.5], 1)


def test_one_owner_gets_the_step_as_it_is():
    out = StepOutput(2.0, ["a", "b"], [5, 6], [fin("a")])
    owner = {"a": b"c1", "b": b"c1"}
    [(client, part)] = split_by_client(out, owner)
    assert client == b"c1" and part is out
    assert owner == {"b": b"c1"}                    # a ended: it leaves the table


def test_two_owners_each_get_their_part():
    out = StepOutput(2.0, ["a", "b", "c", "a"], [1, 2, 3, 4], [fin("b"), fin("x")],
                     logprobs=[lp(1), None, lp(3), lp(4)],
                     prompt_logprobs={"c": [None, lp(9)], "zz": [None]})
    owner = {"a": b"c1", "b": b"c2", "c": b"c2"}
    parts = dict(split_by_client(out, owner))
    assert parts[b"c1"] == StepOutput(2.0, ["a", "a"], [1, 4], [], logprobs=[lp(1), lp(4)])
    assert parts[b"c2"] == StepOutput(2.0, ["b", "c"], [2, 3], [fin("b")], logprobs=[None, lp(3)],
                                      prompt_logprobs={"c": [None, lp(9)]})
    assert owner == {"a": b"c1", "c": b"c2"}        # b ended: it leaves the table


def test_nobodys_requests_go_nowhere():
    out = StepOutput(1.0, ["gone"], [7], [fin("gone")])
    assert split_by_client(out, {}) == []
