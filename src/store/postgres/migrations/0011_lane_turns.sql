-- Migration 11: a kind's `rate` across every instance. Each attempt of a kind with a rate
-- takes the next turn of the kind here (one row per kind, updated in one statement, so the
-- instances' attempts queue on its row lock): `next_at` is when the turn after the last one
-- taken falls, in seconds of the database server's clock.
CREATE TABLE hookledger_lane_turns (
    kind    TEXT PRIMARY KEY,
    next_at DOUBLE PRECISION NOT NULL
);
