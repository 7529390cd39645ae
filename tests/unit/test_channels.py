"""Channel bookkeeping, with no event loop: credit (section 7) as both cores keep it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ttyserve.protocol.channels import Credit


def test_spending_never_overdraws_and_a_grant_adds() -> None:
    credit = Credit(100)
    assert credit.spend(60) and credit.available == 40
    assert not credit.spend(41)  # refused whole: nothing is taken
    assert credit.available == 40
    assert credit.spend(40) and credit.available == 0
    assert not credit.spend(1)
    credit.add(10)
    assert credit.spend(10) and credit.available == 0
    assert credit.spend(0)  # an empty frame costs nothing


def test_the_receiver_grants_back_once_half_the_window_was_taken() -> None:
    credit = Credit(64)
    assert credit.spend(64)
    assert credit.consumed(31) == 0  # less than half: nothing to say yet
    assert credit.consumed(1) == 32  # the grant is all that was taken, and is credit again
    assert credit.available == 32
    assert credit.consumed(10) == 0
    assert credit.consumed(22) == 32
    assert credit.available == 64


def test_a_window_of_one_grants_every_byte() -> None:
    credit = Credit(1)
    assert credit.spend(1) and credit.consumed(1) == 1 and credit.available == 1


@given(window=st.integers(1, 1 << 20),
       sizes=st.lists(st.integers(0, 1 << 20), max_size=50))
def test_the_sender_always_keeps_at_least_half_a_window_in_flight_or_available(
        window: int, sizes: list[int]) -> None:
    """Whatever the sender sends and the receiver takes, credit never goes negative, what is
    owed back stays under half the window, and available plus owed plus in flight is the
    window."""
    credit = Credit(window)
    in_flight = 0
    owed = 0
    for size in sizes:
        size = min(size, credit.available)
        assert credit.spend(size)
        in_flight += size
        grant = credit.consumed(in_flight)  # the receiver takes everything in flight
        owed += in_flight - grant
        in_flight = 0
        assert credit.available >= 0
        assert owed < max(1, window // 2)
        assert credit.available + owed == window
