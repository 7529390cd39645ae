"""Who may connect and as whom (auth.py), and what may be run (policy.py): no event loop."""

from __future__ import annotations

import os

import pytest

from ttyserve.errors import ErrorCode, RequestError
from ttyserve.protocol.messages import Open
from ttyserve.server.auth import FREE_FAILURES, Access, Gate, Peer
from ttyserve.server.policy import Policy


def test_a_unix_peer_of_our_uid_or_an_allowed_one_acts_as_its_uid() -> None:
    gate = Gate(Access(allowed_uids=frozenset({4321})))
    assert gate.admit(Peer("unix", uid=os.getuid(), pid=1), None) == f"uid:{os.getuid()}"
    assert gate.admit(Peer("unix", uid=4321, pid=1), None) == "uid:4321"
    with pytest.raises(RequestError) as info:
        gate.admit(Peer("unix", uid=4322, pid=1), None)
    assert info.value.code == ErrorCode.UNAUTHORIZED


def test_every_holder_of_the_token_is_one_principal_and_a_guesser_is_slowed() -> None:
    gate = Gate(Access(token="secret"))
    peer = Peer("tcp", host="192.0.2.1")
    assert gate.admit(peer, "secret") == gate.admit(Peer("tls", host="192.0.2.9"), "secret")
    for _ in range(FREE_FAILURES):
        assert gate.delay(peer) == 0
        with pytest.raises(RequestError):
            gate.admit(peer, "guess")
    slowed = gate.delay(peer)
    with pytest.raises(RequestError):
        gate.admit(peer, None)
    assert 0 < slowed < gate.delay(peer)  # each further guess waits longer
    assert gate.delay(Peer("tcp", host="192.0.2.2")) == 0  # others are not slowed


def test_stdio_peers_are_the_carrier_s_user_and_need_no_token() -> None:
    assert Gate(Access(token="secret")).admit(Peer("stdio", uid=os.getuid()), None) == (
        f"uid:{os.getuid()}")


def refusal(policy: Policy, request: Open) -> tuple[str, str]:
    with pytest.raises(RequestError) as info:
        policy.check(request)
    return str(info.value.code), info.value.message


def test_the_policy_names_what_it_refuses() -> None:
    policy = Policy(allow_command=["/bin/echo"], allow_env=["GREETING", "LD_*"],
                    max_argv_bytes=64)
    policy.check(Open(argv=["/bin/echo", "hi"], env={"GREETING": "hello"}))
    assert refusal(policy, Open(argv=["/bin/sh"])) == (
        "forbidden", "command '/bin/sh' is not allowed on this server")
    code, message = refusal(policy, Open(argv=["/bin/echo"], env={"LD_PRELOAD": "x.so"}))
    assert code == "forbidden" and "LD_PRELOAD" in message  # a loader, though allowed
    code, message = refusal(policy, Open(argv=["/bin/echo"], env={"OTHER": "1"}))
    assert code == "forbidden" and "--allow-env" in message
    code, message = refusal(policy, Open(argv=["/bin/echo", "x" * 64]))
    assert code == "bad_request" and "argv is" in message
    code, message = refusal(Policy(), Open(argv=["echo", "a\0b"]))
    assert code == "bad_request" and "NUL" in message
    Policy().check(Open(argv=["anything"], env={"LD_PRELOAD": "x.so"}))  # unrestricted
