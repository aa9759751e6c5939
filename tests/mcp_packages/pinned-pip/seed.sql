CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO counters VALUES ('alpha', 1), ('beta', 7), ('gamma', 3);
