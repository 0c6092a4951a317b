-- The transport: the database as the broker (see Transport).
--
-- Every published message is appended once to the log, and, in the same
-- statement, gets one row in idem_transport_pending for each consumer name
-- of its topic: the queue of that consumer name, from which its streams take
-- the oldest visible row with SELECT ... FOR UPDATE SKIP LOCKED. Settling a
-- delivery (Ack, Term) deletes the row; Purge deletes log rows no consumer
-- name has a row for.

-- The log. seq orders it; published_at is the transport's clock at Publish,
-- for Purge. headers is a JSON object, NULL when there are none, whose keys
-- and values are base64 when headers_base64 is set (jsonb holds neither
-- invalid UTF-8 nor NUL).
CREATE TABLE idem_transport_messages (
    seq            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic          text COLLATE "C" NOT NULL,
    id             text COLLATE "C" NOT NULL,
    key            text COLLATE "C" NOT NULL,
    headers        jsonb,
    headers_base64 boolean     NOT NULL DEFAULT false,
    payload        bytea       NOT NULL,
    msg_time       timestamptz NOT NULL,
    published_at   timestamptz NOT NULL
);

-- One row per topic that has been published to or subscribed to: the lock
-- that keeps a consumer name's first Subscribe and concurrent Publishes from
-- missing each other. Publish holds it FOR SHARE until its transaction ends,
-- so publishers never wait for each other; the first Subscribe of a consumer
-- name updates it (bumping subscribed), which waits for every publisher
-- holding it and makes publishers that come later wait for the new consumer
-- name to commit. A REPEATABLE READ or SERIALIZABLE publisher whose snapshot
-- predates that update gets a serialization failure instead of missing the
-- new consumer name.
CREATE TABLE idem_transport_topics (
    topic      text COLLATE "C" PRIMARY KEY,
    subscribed bigint NOT NULL DEFAULT 0
);

-- A durable subscription: one consumer name of one topic.
CREATE TABLE idem_transport_consumers (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic      text COLLATE "C" NOT NULL,
    consumer   text COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (topic, consumer)
);

-- A consumer name's unsettled messages. visible_at is when the row may be
-- handed out (again): -infinity until its first delivery, then the end of
-- the holder's AckWait or of a Nack's delay. owner (a stream) and
-- owner_token (its delivery) name the holder; NULL after a Nack. attempts
-- counts hand-outs. Nothing indexed changes when a row is handed out or
-- given back, so with the room fillfactor leaves those updates stay on their
-- page (HOT) and write no index entries.
CREATE TABLE idem_transport_pending (
    consumer_id bigint      NOT NULL,
    seq         bigint      NOT NULL,
    attempts    integer     NOT NULL DEFAULT 0,
    visible_at  timestamptz NOT NULL DEFAULT '-infinity',
    owner       bigint,
    owner_token bigint,
    PRIMARY KEY (consumer_id, seq)
) WITH (fillfactor = 80);
