from crmstack.backoff import RestartBackoff


def test_doubles_while_crashing_and_resets_after_a_healthy_run() -> None:
    backoff = RestartBackoff(first=0.5, cap=4.0, healthy_after=30.0)
    delays = [backoff.delay("postgres", started_at=100.0, now=101.0) for _ in range(5)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff.delay("postgres", started_at=100.0, now=131.0) == 0.5
    assert backoff.delay("nats", started_at=100.0, now=101.0) == 0.5
