"""The limiter's book of open reservations: settled once, bounded, a failure then a success."""

from __future__ import annotations

import time

from litellm_ratebalance.proxy.admission.tickets import AdmissionTicket, TicketBook


def ticket(held: int = 100, *, expires_at: float | None = None) -> AdmissionTicket:
    expiry = time.monotonic() + 3600 if expires_at is None else expires_at
    return AdmissionTicket("m", "d", 60_000, held, expiry, learn_beyond=20)


def test_close_returns_the_ticket_once() -> None:
    book = TicketBook()
    first, second = book.open(ticket(100)), book.open(ticket(50))
    assert first != second and len(book) == 2
    closed = book.close(first)
    assert closed is not None and closed.held_tokens == 100
    assert book.close(first) is None and len(book) == 1


def test_release_gives_the_held_tokens_back_once_and_keeps_the_window_for_a_later_success() -> None:
    book = TicketBook()
    ticket_id = book.open(ticket(100))
    released = book.release(ticket_id)
    assert released is not None and (released.held_tokens, released.learn_beyond) == (100, None)
    again = book.release(ticket_id)
    assert again is not None and again.held_tokens == 0  # a second failure hook gives nothing back
    success = book.close(ticket_id)
    assert success is not None and (success.window_start_ms, success.held_tokens, success.learn_beyond) == (
        60_000,
        0,
        20,
    )


def test_expired_tickets_and_the_oldest_past_the_bound_are_forgotten() -> None:
    book = TicketBook(max_open=3)
    stale = book.open(ticket(expires_at=time.monotonic() - 1))
    fresh = [book.open(ticket()) for _ in range(3)]
    assert book.get(stale) is None  # expired: forgotten at the next open
    assert [book.get(t) is not None for t in fresh] == [True, True, True]
    newest = book.open(ticket())
    assert book.get(fresh[0]) is None and book.get(newest) is not None and len(book) == 3


def test_drop_forgets_a_ticket() -> None:
    book = TicketBook()
    ticket_id = book.open(ticket())
    book.drop(ticket_id)
    book.drop(ticket_id)
    assert book.get(ticket_id) is None and len(book) == 0
