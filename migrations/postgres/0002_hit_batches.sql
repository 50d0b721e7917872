-- Every batch of hit counts carries an id, recorded in the same transaction
-- that applies it: a batch whose commit was never confirmed (or that was
-- spilled to disk) can be applied again without counting twice.
CREATE TABLE hit_batches (
    id         TEXT PRIMARY KEY,
    applied_at TEXT NOT NULL
);
CREATE INDEX hit_batches_applied_at ON hit_batches (applied_at);
