import pg from "pg";
import { GatewayError } from "../../core/gateway-error.ts";
import { rateSkewNs } from "../../core/call-rate.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";

/**
 * Schema step 15's gw_admit_many, as it was written. Steps 26 and 27 are
 * the same body with an edit each, so all three are kept from one text.
 */
const admitWithRateCounted = `CREATE OR REPLACE FUNCTION gw_admit_many(p_leases text[], p_account text, p_day text, p_prices bigint[], p_daily_max bigint, p_concurrency integer,
                                           p_holder text, p_now bigint, p_lease_ms bigint, p_rate_interval bigint, p_rate_tolerance bigint)
                                           RETURNS text[] LANGUAGE plpgsql AS $$
  DECLARE
    n integer := coalesce(array_length(p_leases, 1), 0);
    in_flight bigint;
    day_pending bigint;
    reserved bigint;
    stale bigint;
    committed bigint;
    balance bigint;
    now_ns bigint := p_now * 1000000;
    tat bigint;
    verdicts text[] := '{}';
    admitted integer[] := '{}';
  BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('gateway admission ' || p_account, 0));
    SELECT coalesce(sum(o.calls), 0), coalesce(sum(o.calls) FILTER (WHERE o.day = p_day), 0), coalesce(sum(o.amount), 0),
           count(*) FILTER (WHERE o.day <> p_day AND o.calls = 0)
      INTO in_flight, day_pending, reserved, stale FROM admissions_open o WHERE o.account = p_account;
    SELECT coalesce((SELECT charged FROM usage_daily WHERE account = p_account AND day = p_day), 0) INTO committed;
    SELECT micros INTO balance FROM balances WHERE account = p_account;
    IF p_rate_interval > 0 THEN
      SELECT greatest(coalesce((SELECT r.tat FROM rate_arrivals r WHERE r.account = p_account), now_ns), now_ns) INTO tat;
    END IF;
    IF in_flight + n > p_concurrency OR committed + day_pending + n > p_daily_max
       OR (balance IS NOT NULL AND balance - reserved < (SELECT coalesce(sum(x), 0) FROM unnest(p_prices) AS x)) THEN
      -- Some call would be refused: first free what leases that expired still hold.
      DELETE FROM admissions WHERE account = p_account AND expires_at < p_now;
      IF FOUND THEN
        SELECT coalesce(sum(o.calls), 0), coalesce(sum(o.calls) FILTER (WHERE o.day = p_day), 0), coalesce(sum(o.amount), 0)
          INTO in_flight, day_pending, reserved FROM admissions_open o WHERE o.account = p_account;
      END IF;
    END IF;
    IF stale > 0 THEN
      -- Days whose every lease is settled: nothing will count against them again.
      DELETE FROM admission_totals WHERE account = p_account AND day IN (SELECT day FROM admissions_open WHERE account = p_account AND day <> p_day AND calls = 0);
    END IF;
    FOR i IN 1 .. n LOOP
      IF in_flight >= p_concurrency THEN
        verdicts := verdicts || ('concurrency ' || in_flight);
      ELSIF committed + day_pending >= p_daily_max THEN
        verdicts := verdicts || ('daily ' || (committed + day_pending));
      ELSIF balance IS NOT NULL AND balance - reserved < p_prices[i] THEN
        verdicts := verdicts || ('balance ' || (balance - reserved));
      ELSIF p_rate_interval > 0 AND tat - now_ns > p_rate_tolerance THEN
        verdicts := verdicts || ('rate ' || (tat - now_ns - p_rate_tolerance));
      ELSE
        in_flight := in_flight + 1;
        day_pending := day_pending + 1;
        reserved := reserved + p_prices[i];
        tat := tat + p_rate_interval;
        admitted := admitted || i;
        verdicts := verdicts || ('ok ' || (committed + day_pending) || CASE WHEN p_rate_interval > 0 THEN ' ' || tat ELSE '' END);
      END IF;
    END LOOP;
    IF array_length(admitted, 1) > 0 THEN
      INSERT INTO admissions (lease, account, day, price, holder, expires_at)
        SELECT p_leases[i], p_account, p_day, p_prices[i], p_holder, p_now + p_lease_ms FROM unnest(admitted) AS i;
      IF p_rate_interval > 0 THEN
        INSERT INTO rate_arrivals (account, tat) VALUES (p_account, tat) ON CONFLICT (account) DO UPDATE SET tat = excluded.tat;
      END IF;
    END IF;
    RETURN verdicts;
  END $$;`;

/**
 * Step 26's gw_admit_many: step 15's, with a rate's arrival time read
 * within what its clock could leave.
 */
const admitWithRateBounded = replaceOnce(
  admitWithRateCounted,
  "SELECT greatest(coalesce((SELECT r.tat FROM rate_arrivals r WHERE r.account = p_account), now_ns), now_ns) INTO tat;",
  `SELECT greatest(coalesce((SELECT r.tat FROM rate_arrivals r WHERE r.account = p_account), now_ns), now_ns) INTO tat;
    IF tat - now_ns > p_rate_tolerance + p_rate_interval THEN
      tat := now_ns + p_rate_tolerance;
    END IF;`,
);

/** Step 27's gw_admit_many: step 26's, with leases expiring on PostgreSQL's clock. */
const admitOnDatabaseClock = replaceEach(admitWithRateBounded, [
  ["DELETE FROM admissions WHERE account = p_account AND expires_at < p_now;", "DELETE FROM admissions WHERE account = p_account AND expires_at < gw_clock_ms();"],
  ["p_holder, p_now + p_lease_ms FROM unnest(admitted)", "p_holder, gw_clock_ms() + p_lease_ms FROM unnest(admitted)"],
]);

/** Step 16's gw_claim_key, as it was written (step 27 is the same on PostgreSQL's clock). */
const claimKeyOnReplicaClock = `CREATE FUNCTION gw_claim_key(p_account text, p_key text, p_fingerprint text, p_token text, p_now bigint, p_hold_ms bigint, p_kept_ms bigint)
                               RETURNS text LANGUAGE plpgsql AS $$
  DECLARE
    k idempotency_keys;
  BEGIN
    -- Twice at most: a hold given back between the insert and the read is taken by the second try.
    FOR attempt IN 1 .. 2 LOOP
      INSERT INTO idempotency_keys AS t (account, key, fingerprint, token, expires_at, request_id, at)
        VALUES (p_account, p_key, p_fingerprint, p_token, p_now + p_hold_ms, NULL, p_now)
        ON CONFLICT (account, key) DO UPDATE
          SET fingerprint = excluded.fingerprint, token = excluded.token, expires_at = excluded.expires_at, request_id = NULL, at = excluded.at
          WHERE (t.request_id IS NULL AND t.expires_at <= p_now) OR (t.request_id IS NOT NULL AND t.at <= p_now - p_kept_ms)
        RETURNING * INTO k;
      IF FOUND THEN RETURN 'taken'; END IF;
      SELECT * INTO k FROM idempotency_keys WHERE account = p_account AND key = p_key;
      IF FOUND THEN
        IF k.fingerprint <> p_fingerprint THEN RETURN 'other'; END IF;
        IF k.request_id IS NULL THEN RETURN 'in_flight'; END IF;
        RETURN 'replay ' || k.request_id;
      END IF;
    END LOOP;
    RETURN 'in_flight';
  END $$;`;

/**
 * The shared store's schema in PostgreSQL, the source of truth of shared
 * mode: accounts, balances, operator switches, the usage ledger with its day
 * counts, and the catalogue. As with the embedded store, the schema is the
 * steps that build it; a database at version n runs steps n+1… at start.
 * Money is integer micro-units (bigint), times are Unix milliseconds, days
 * are the account's `YYYY-MM-DD`.
 */
export const migrations: readonly string[] = [
  // 1: the embedded store's schema 5, with the balance in a table of its own: it is the meter's
  // (charged calls deduct from it in the ledger's transaction), not the account's.
  `CREATE TABLE accounts (
    key text PRIMARY KEY,
    name text NOT NULL,
    secret_hash text NOT NULL,
    secret_salt text NOT NULL,
    legacy_signing_key text,
    hmac_key text,
    status text NOT NULL CHECK (status IN ('active', 'stopped')),
    operations jsonb NOT NULL,
    daily_max bigint NOT NULL,
    concurrency integer NOT NULL,
    prices jsonb NOT NULL,
    expires text NOT NULL,
    zone text NOT NULL,
    created_at bigint NOT NULL
  );
  -- No foreign key: a new prepaid account's balance is written before the account row, so the
  -- account never exists unbilled for a moment.
  CREATE TABLE balances (
    account text PRIMARY KEY,
    micros bigint NOT NULL CHECK (micros >= 0)
  );
  CREATE TABLE usage_daily (
    account text NOT NULL,
    day text NOT NULL,
    charged bigint NOT NULL,
    PRIMARY KEY (account, day)
  );
  CREATE TABLE ledger (
    request_id text PRIMARY KEY,
    at bigint NOT NULL,
    day text NOT NULL,
    account text,
    operation text,
    error_code integer NOT NULL,
    charge text NOT NULL CHECK (charge IN ('charged', 'uncharged', 'ignored')),
    price bigint NOT NULL,
    cache_hit boolean NOT NULL,
    latency_us bigint NOT NULL,
    transport text NOT NULL
  );
  CREATE INDEX ledger_by_account_day ON ledger (account, day);
  CREATE INDEX ledger_by_day ON ledger (day);
  CREATE TABLE ledger_daily_totals (
    day text NOT NULL,
    account text NOT NULL,
    operation text NOT NULL,
    error_code integer NOT NULL,
    charge text NOT NULL,
    calls bigint NOT NULL,
    amount bigint NOT NULL,
    PRIMARY KEY (day, account, operation, error_code, charge)
  );
  CREATE TABLE refusals (
    day text NOT NULL,
    operation text NOT NULL,
    error_code integer NOT NULL,
    charge text NOT NULL,
    client_ip text NOT NULL,
    transport text NOT NULL,
    calls bigint NOT NULL,
    PRIMARY KEY (day, operation, error_code, client_ip, transport)
  );
  CREATE TABLE maintenance (operation text PRIMARY KEY);
  CREATE TABLE catalogue_records (
    catalogue text NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    record bytea NOT NULL,
    obtainable boolean NOT NULL,
    stored_at bigint NOT NULL,
    PRIMARY KEY (catalogue, kind, key)
  );`,
  // 2: admission. A call let through an account's limits holds a lease row until its ledger row
  // commits (in the same transaction that deletes the lease) or the lease expires (its replica died).
  // gw_admit_many decides, in order, the calls of one account that a replica received in one turn of
  // its event loop, under one take of a per-account advisory lock, so any number of replicas admit
  // exactly: in flight < concurrency, committed + pending < daily maximum, balance minus what pending
  // calls may still cost >= price. Expired leases are dropped before each decision.
  `CREATE TABLE admissions (
    lease text PRIMARY KEY,
    account text NOT NULL,
    day text NOT NULL,
    price bigint NOT NULL,
    holder text NOT NULL,
    expires_at bigint NOT NULL
  );
  CREATE INDEX admissions_by_account ON admissions (account);
  CREATE FUNCTION gw_admit_many(p_leases text[], p_account text, p_day text, p_prices bigint[], p_daily_max bigint, p_concurrency integer,
                                p_holder text, p_now bigint, p_lease_ms bigint) RETURNS text[] LANGUAGE plpgsql AS $$
  DECLARE
    in_flight bigint;
    day_pending bigint;
    reserved bigint;
    committed bigint;
    balance bigint;
    verdicts text[] := '{}';
    admitted integer[] := '{}';
  BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('gateway admission ' || p_account, 0));
    DELETE FROM admissions WHERE account = p_account AND expires_at < p_now;
    SELECT count(*), count(*) FILTER (WHERE day = p_day), coalesce(sum(price), 0) INTO in_flight, day_pending, reserved
      FROM admissions WHERE account = p_account;
    SELECT coalesce((SELECT charged FROM usage_daily WHERE account = p_account AND day = p_day), 0) INTO committed;
    SELECT micros INTO balance FROM balances WHERE account = p_account;
    FOR i IN 1 .. coalesce(array_length(p_leases, 1), 0) LOOP
      IF in_flight >= p_concurrency THEN
        verdicts := verdicts || ('concurrency ' || in_flight);
      ELSIF committed + day_pending >= p_daily_max THEN
        verdicts := verdicts || ('daily ' || (committed + day_pending));
      ELSIF balance IS NOT NULL AND balance - reserved < p_prices[i] THEN
        verdicts := verdicts || ('balance ' || (balance - reserved));
      ELSE
        in_flight := in_flight + 1;
        day_pending := day_pending + 1;
        reserved := reserved + p_prices[i];
        admitted := admitted || i;
        verdicts := verdicts || 'ok'::text;
      END IF;
    END LOOP;
    INSERT INTO admissions (lease, account, day, price, holder, expires_at)
      SELECT p_leases[i], p_account, p_day, p_prices[i], p_holder, p_now + p_lease_ms FROM unnest(admitted) AS i;
    RETURN verdicts;
  END $$;`,
  // 3: used signatures (md5 signs and nonces), so a signed call is accepted once across every
  // replica and every restart, for its whole window.
  `CREATE TABLE used_signatures (id text PRIMARY KEY, until bigint NOT NULL);
  CREATE INDEX used_signatures_by_until ON used_signatures (until);`,
  // 4: how many of a day's folded calls were answered from the cache (as the embedded store's step 7).
  `ALTER TABLE ledger_daily_totals ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0;`,
  // 5: each account's leases counted per day, kept by triggers on admissions, so a decision reads a
  // few rows instead of counting leases. Counting them had scanned every lease the account had had
  // since the last vacuum, live or dead: at a thousand calls a second, thousands of dead rows a
  // decision. Leases written and leases deleted are counted in rows of their own: the first only
  // under the account's admission lock, the second by the commits, so the two never wait for each
  // other. The triggers count whatever writes admissions (an older replica in a rolling upgrade
  // included); the lock keeps any lease from being written between the backfill and the triggers.
  // Leases that expired (their replica died) are swept only when they would refuse a call.
  `LOCK TABLE admissions IN SHARE ROW EXCLUSIVE MODE;
  CREATE TABLE admission_totals (
    account text NOT NULL,
    day text NOT NULL,
    side text NOT NULL CHECK (side IN ('written', 'deleted')),
    calls bigint NOT NULL,
    amount bigint NOT NULL,
    PRIMARY KEY (account, day, side)
  );
  INSERT INTO admission_totals (account, day, side, calls, amount) SELECT account, day, 'written', count(*), sum(price) FROM admissions GROUP BY account, day;
  CREATE FUNCTION gw_admissions_written() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO admission_totals (account, day, side, calls, amount)
      SELECT account, day, 'written', count(*), sum(price) FROM written GROUP BY account, day
      ON CONFLICT (account, day, side) DO UPDATE SET calls = admission_totals.calls + excluded.calls, amount = admission_totals.amount + excluded.amount;
    RETURN NULL;
  END $$;
  CREATE FUNCTION gw_admissions_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO admission_totals (account, day, side, calls, amount)
      SELECT account, day, 'deleted', count(*), sum(price) FROM deleted GROUP BY account, day
      ON CONFLICT (account, day, side) DO UPDATE SET calls = admission_totals.calls + excluded.calls, amount = admission_totals.amount + excluded.amount;
    RETURN NULL;
  END $$;
  CREATE TRIGGER admissions_written AFTER INSERT ON admissions REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION gw_admissions_written();
  CREATE TRIGGER admissions_deleted AFTER DELETE ON admissions REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION gw_admissions_deleted();
  CREATE VIEW admissions_open AS
    SELECT account, day, sum(CASE side WHEN 'written' THEN calls ELSE -calls END) AS calls, sum(CASE side WHEN 'written' THEN amount ELSE -amount END) AS amount
      FROM admission_totals GROUP BY account, day;
  CREATE OR REPLACE FUNCTION gw_admit_many(p_leases text[], p_account text, p_day text, p_prices bigint[], p_daily_max bigint, p_concurrency integer,
                                           p_holder text, p_now bigint, p_lease_ms bigint) RETURNS text[] LANGUAGE plpgsql AS $$
  DECLARE
    n integer := coalesce(array_length(p_leases, 1), 0);
    in_flight bigint;
    day_pending bigint;
    reserved bigint;
    stale bigint;
    committed bigint;
    balance bigint;
    verdicts text[] := '{}';
    admitted integer[] := '{}';
  BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('gateway admission ' || p_account, 0));
    SELECT coalesce(sum(o.calls), 0), coalesce(sum(o.calls) FILTER (WHERE o.day = p_day), 0), coalesce(sum(o.amount), 0),
           count(*) FILTER (WHERE o.day <> p_day AND o.calls = 0)
      INTO in_flight, day_pending, reserved, stale FROM admissions_open o WHERE o.account = p_account;
    SELECT coalesce((SELECT charged FROM usage_daily WHERE account = p_account AND day = p_day), 0) INTO committed;
    SELECT micros INTO balance FROM balances WHERE account = p_account;
    IF in_flight + n > p_concurrency OR committed + day_pending + n > p_daily_max
       OR (balance IS NOT NULL AND balance - reserved < (SELECT coalesce(sum(x), 0) FROM unnest(p_prices) AS x)) THEN
      -- Some call would be refused: first free what leases that expired still hold.
      DELETE FROM admissions WHERE account = p_account AND expires_at < p_now;
      IF FOUND THEN
        SELECT coalesce(sum(o.calls), 0), coalesce(sum(o.calls) FILTER (WHERE o.day = p_day), 0), coalesce(sum(o.amount), 0)
          INTO in_flight, day_pending, reserved FROM admissions_open o WHERE o.account = p_account;
      END IF;
    END IF;
    IF stale > 0 THEN
      -- Days whose every lease is settled: nothing will count against them again.
      DELETE FROM admission_totals WHERE account = p_account AND day IN (SELECT day FROM admissions_open WHERE account = p_account AND day <> p_day AND calls = 0);
    END IF;
    FOR i IN 1 .. n LOOP
      IF in_flight >= p_concurrency THEN
        verdicts := verdicts || ('concurrency ' || in_flight);
      ELSIF committed + day_pending >= p_daily_max THEN
        verdicts := verdicts || ('daily ' || (committed + day_pending));
      ELSIF balance IS NOT NULL AND balance - reserved < p_prices[i] THEN
        verdicts := verdicts || ('balance ' || (balance - reserved));
      ELSE
        in_flight := in_flight + 1;
        day_pending := day_pending + 1;
        reserved := reserved + p_prices[i];
        admitted := admitted || i;
        verdicts := verdicts || 'ok'::text;
      END IF;
    END LOOP;
    IF array_length(admitted, 1) > 0 THEN
      INSERT INTO admissions (lease, account, day, price, holder, expires_at)
        SELECT p_leases[i], p_account, p_day, p_prices[i], p_holder, p_now + p_lease_ms FROM unnest(admitted) AS i;
    END IF;
    RETURN verdicts;
  END $$;`,
  // 6: every change of a balance that is not a call's price (as the embedded store's step 8), with the
  // balance it left, written in the statement that makes it. A balance held before this step is
  // recorded as carried over, at the time of the upgrade.
  `CREATE TABLE balance_changes (
    id bigserial PRIMARY KEY,
    account text NOT NULL,
    at bigint NOT NULL,
    kind text NOT NULL CHECK (kind IN ('opening', 'top-up', 'carried', 'unbilled')),
    amount bigint NOT NULL,
    balance bigint
  );
  CREATE INDEX balance_changes_by_account ON balance_changes (account, id);
  INSERT INTO balance_changes (account, at, kind, amount, balance)
    SELECT account, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'carried', micros, micros FROM balances ORDER BY account;`,
  // 7: a replaced secret still accepted for a while after a rotation (as the embedded store's step 9).
  `ALTER TABLE accounts ADD COLUMN previous_secret jsonb;`,
  // 8: each change of an account's settings with who made it and what it moved, and who made each balance
  // change (as the embedded store's step 10).
  `CREATE TABLE account_changes (
    id bigserial PRIMARY KEY,
    account text NOT NULL,
    at bigint NOT NULL,
    kind text NOT NULL,
    actor text NOT NULL,
    changes jsonb NOT NULL
  );
  CREATE INDEX account_changes_by_account ON account_changes (account, id);
  ALTER TABLE balance_changes ADD COLUMN actor text;`,
  // 9: named admins (as the embedded store's step 11).
  `CREATE TABLE admin_tokens (
    name text PRIMARY KEY,
    token_hash text NOT NULL UNIQUE,
    created_at bigint NOT NULL,
    created_by text NOT NULL,
    revoked_at bigint,
    revoked_by text
  );`,
  // 10: each switch into or out of maintenance, with who made it (as the embedded store's step 12).
  `CREATE TABLE maintenance_changes (
    id bigserial PRIMARY KEY,
    at bigint NOT NULL,
    operation text NOT NULL,
    switched_on boolean NOT NULL,
    actor text NOT NULL
  );`,
  // 11: an account's rate limit (as the embedded store's step 13), and where each rated account's
  // theoretical arrival time is kept, in nanoseconds (src/core/call-rate.ts). Admission becomes step 5's
  // statement deciding the rate as well (an interval of 0: none), under the same lock, after the other
  // limits; step 5's signature, which replicas of the previous version call, now calls it without a rate,
  // so one body decides for every replica.
  `ALTER TABLE accounts ADD COLUMN rate jsonb;
  CREATE TABLE rate_arrivals (account text PRIMARY KEY, tat bigint NOT NULL);
  CREATE FUNCTION gw_admit_many(p_leases text[], p_account text, p_day text, p_prices bigint[], p_daily_max bigint, p_concurrency integer,
                                p_holder text, p_now bigint, p_lease_ms bigint, p_rate_interval bigint, p_rate_tolerance bigint)
                                RETURNS text[] LANGUAGE plpgsql AS $$
  DECLARE
    n integer := coalesce(array_length(p_leases, 1), 0);
    in_flight bigint;
    day_pending bigint;
    reserved bigint;
    stale bigint;
    committed bigint;
    balance bigint;
    now_ns bigint := p_now * 1000000;
    tat bigint;
    verdicts text[] := '{}';
    admitted integer[] := '{}';
  BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('gateway admission ' || p_account, 0));
    SELECT coalesce(sum(o.calls), 0), coalesce(sum(o.calls) FILTER (WHERE o.day = p_day), 0), coalesce(sum(o.amount), 0),
           count(*) FILTER (WHERE o.day <> p_day AND o.calls = 0)
      INTO in_flight, day_pending, reserved, stale FROM admissions_open o WHERE o.account = p_account;
    SELECT coalesce((SELECT charged FROM usage_daily WHERE account = p_account AND day = p_day), 0) INTO committed;
    SELECT micros INTO balance FROM balances WHERE account = p_account;
    IF p_rate_interval > 0 THEN
      SELECT greatest(coalesce((SELECT r.tat FROM rate_arrivals r WHERE r.account = p_account), now_ns), now_ns) INTO tat;
    END IF;
    IF in_flight + n > p_concurrency OR committed + day_pending + n > p_daily_max
       OR (balance IS NOT NULL AND balance - reserved < (SELECT coalesce(sum(x), 0) FROM unnest(p_prices) AS x)) THEN
      -- Some call would be refused: first free what leases that expired still hold.
      DELETE FROM admissions WHERE account = p_account AND expires_at < p_now;
      IF FOUND THEN
        SELECT coalesce(sum(o.calls), 0), coalesce(sum(o.calls) FILTER (WHERE o.day = p_day), 0), coalesce(sum(o.amount), 0)
          INTO in_flight, day_pending, reserved FROM admissions_open o WHERE o.account = p_account;
      END IF;
    END IF;
    IF stale > 0 THEN
      -- Days whose every lease is settled: nothing will count against them again.
      DELETE FROM admission_totals WHERE account = p_account AND day IN (SELECT day FROM admissions_open WHERE account = p_account AND day <> p_day AND calls = 0);
    END IF;
    FOR i IN 1 .. n LOOP
      IF in_flight >= p_concurrency THEN
        verdicts := verdicts || ('concurrency ' || in_flight);
      ELSIF committed + day_pending >= p_daily_max THEN
        verdicts := verdicts || ('daily ' || (committed + day_pending));
      ELSIF balance IS NOT NULL AND balance - reserved < p_prices[i] THEN
        verdicts := verdicts || ('balance ' || (balance - reserved));
      ELSIF p_rate_interval > 0 AND tat - now_ns > p_rate_tolerance THEN
        verdicts := verdicts || ('rate ' || (tat - now_ns - p_rate_tolerance));
      ELSE
        in_flight := in_flight + 1;
        day_pending := day_pending + 1;
        reserved := reserved + p_prices[i];
        tat := tat + p_rate_interval;
        admitted := admitted || i;
        verdicts := verdicts || 'ok'::text;
      END IF;
    END LOOP;
    IF array_length(admitted, 1) > 0 THEN
      INSERT INTO admissions (lease, account, day, price, holder, expires_at)
        SELECT p_leases[i], p_account, p_day, p_prices[i], p_holder, p_now + p_lease_ms FROM unnest(admitted) AS i;
      IF p_rate_interval > 0 THEN
        INSERT INTO rate_arrivals (account, tat) VALUES (p_account, tat) ON CONFLICT (account) DO UPDATE SET tat = excluded.tat;
      END IF;
    END IF;
    RETURN verdicts;
  END $$;
  CREATE OR REPLACE FUNCTION gw_admit_many(p_leases text[], p_account text, p_day text, p_prices bigint[], p_daily_max bigint, p_concurrency integer,
                                           p_holder text, p_now bigint, p_lease_ms bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT gw_admit_many(p_leases, p_account, p_day, p_prices, p_daily_max, p_concurrency, p_holder, p_now, p_lease_ms, 0::bigint, 0::bigint)
  $$;`,
  // 12: accounts in the order ListAccounts pages them (made, then key by code unit), so a page is read from where
  // the last ended.
  `CREATE INDEX accounts_in_order ON accounts (created_at, key COLLATE "C");`,
  // 13: the addresses and networks an account's key works from (a JSON list), or anywhere.
  `ALTER TABLE accounts ADD COLUMN allowed_from jsonb;`,
  // 14: the address each call came from (as the embedded store's step 16); none for the rows written before.
  `ALTER TABLE ledger ADD COLUMN client_ip text;`,
  // 15: an admitted call's verdict says what the limits counted once it was let through, for the RateLimit
  // header fields: `ok <the day's calls, charged and in flight, this one included> [<the rate's theoretical
  // arrival time, ns>]`. Replicas of the previous version read any verdict that names no limit as admitted.
  admitWithRateCounted,
  // 16: idempotency keys (src/core/idempotency.ts). A key is held by the call that took it (`token`, until
  // `expires_at`, renewed with its replica's leases, so a dead replica's hold lapses), and kept once that call is
  // charged (`request_id`), in the commit that writes its ledger row, for a day. gw_claim_key decides a key in one
  // statement: taken (a new key, a lapsed hold, or one kept longer than p_kept_ms), `in_flight`, `other` (kept for
  // another request) or `replay <request id>`. A second call of the same key waits on the first's row lock, so no two
  // calls take one key.
  `CREATE TABLE idempotency_keys (
    account text NOT NULL,
    key text NOT NULL,
    fingerprint text NOT NULL,
    token text,
    expires_at bigint,
    request_id text,
    at bigint NOT NULL,
    PRIMARY KEY (account, key)
  );
  CREATE INDEX idempotency_keys_at ON idempotency_keys (at);
  CREATE INDEX idempotency_keys_held ON idempotency_keys (token) WHERE token IS NOT NULL;
  ${claimKeyOnReplicaClock}`,
  // 17: the payment a top-up is for (as the embedded store's step 19): one top-up per account and reference.
  `ALTER TABLE balance_changes ADD COLUMN reference text;
  CREATE UNIQUE INDEX balance_changes_reference ON balance_changes (account, reference) WHERE reference IS NOT NULL;`,
  // 18: usage alerts (as the embedded store's step 20): the settings, their signing secret, and each alert to tell,
  // recorded by a trigger in the statement that moves the day's count or the balance across a line. The count's row
  // is locked by that statement, so of any number of replicas committing the account's calls at once exactly one
  // moves it across each line; a usage share is told once a day, a key's expiry once per last day.
  `ALTER TABLE accounts ADD COLUMN alerts jsonb;
  ALTER TABLE accounts ADD COLUMN alert_secret text;
  CREATE TABLE alerts (
    id bigserial PRIMARY KEY,
    account text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('usage', 'balance', 'expiry')),
    level bigint NOT NULL,
    value bigint NOT NULL,
    lim bigint NOT NULL,
    day text NOT NULL,
    at bigint NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    next_at bigint,
    claimed_until bigint NOT NULL DEFAULT 0,
    delivered_at bigint,
    last_error text NOT NULL DEFAULT ''
  );
  CREATE UNIQUE INDEX alerts_once ON alerts (account, day, level) WHERE kind <> 'balance';
  CREATE INDEX alerts_due ON alerts (next_at) WHERE next_at IS NOT NULL;
  CREATE INDEX alerts_by_account ON alerts (account, id);
  CREATE FUNCTION gw_usage_alerts() RETURNS trigger LANGUAGE plpgsql AS $$
  DECLARE
    was bigint := 0;
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  BEGIN
    IF TG_OP = 'UPDATE' THEN was := OLD.charged; END IF;
    IF NEW.charged <= was THEN RETURN NULL; END IF;
    INSERT INTO alerts (account, kind, level, value, lim, day, at, next_at)
      SELECT NEW.account, 'usage', t.percent, NEW.charged, a.daily_max, NEW.day, now_ms, now_ms
      FROM accounts a CROSS JOIN LATERAL (
        SELECT p::bigint AS percent, (a.daily_max * p::bigint + 99) / 100 AS line FROM jsonb_array_elements_text(a.alerts -> 'usage') AS p
      ) t
      WHERE a.key = NEW.account AND a.alerts IS NOT NULL AND t.line > was AND NEW.charged >= t.line
      ON CONFLICT (account, day, level) WHERE kind <> 'balance' DO NOTHING;
    RETURN NULL;
  END $$;
  CREATE TRIGGER usage_alerts AFTER INSERT OR UPDATE OF charged ON usage_daily FOR EACH ROW EXECUTE FUNCTION gw_usage_alerts();
  CREATE FUNCTION gw_balance_alerts() RETURNS trigger LANGUAGE plpgsql AS $$
  DECLARE
    below bigint;
    now_ms bigint;
  BEGIN
    IF NEW.micros >= OLD.micros THEN RETURN NULL; END IF;
    SELECT (alerts ->> 'below')::bigint INTO below FROM accounts WHERE key = NEW.account;
    IF below IS NULL OR OLD.micros < below OR NEW.micros >= below THEN RETURN NULL; END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    INSERT INTO alerts (account, kind, level, value, lim, day, at, next_at)
      VALUES (NEW.account, 'balance', below, NEW.micros, 0, to_char(to_timestamp(now_ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD'), now_ms, now_ms);
    RETURN NULL;
  END $$;
  CREATE TRIGGER balance_alerts AFTER UPDATE OF micros ON balances FOR EACH ROW EXECUTE FUNCTION gw_balance_alerts();`,
  // 19: the operator's own id for an account, unique where given, and a digest of the request that made it (as the
  // embedded store's step 21).
  `ALTER TABLE accounts ADD COLUMN external_id text;
  ALTER TABLE accounts ADD COLUMN created_with text;
  CREATE UNIQUE INDEX accounts_external_id ON accounts (external_id) WHERE external_id IS NOT NULL;`,
  // 20: the alert secret a new one replaced, still signed with until a time (as the embedded store's step 22).
  `ALTER TABLE accounts ADD COLUMN previous_alert_secret jsonb;`,
  // 21: the ledger's indexes in the order calls are listed page by page (as the embedded store's step 23).
  `DROP INDEX ledger_by_account_day;
  CREATE INDEX ledger_by_account_day ON ledger (account, day, at);
  DROP INDEX ledger_by_day;
  CREATE INDEX ledger_by_day ON ledger (day, at);`,
  // 22: the ledger in commit order (core/usage-pages.ts followCalls; the embedded store's step 24): the id of the
  // transaction that wrote each row, so a follower is given a row only once no transaction before it can still
  // commit (PostgresMeter.feed). Rows written before hold 0 (a constant default: no rewrite of the table).
  `ALTER TABLE ledger ADD COLUMN txid xid8 NOT NULL DEFAULT '0';
  ALTER TABLE ledger ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
  CREATE INDEX ledger_in_commit_order ON ledger (txid, request_id COLLATE "C");`,
  // 23: retention (PostgresMeter.expire; the embedded store's step 24): the last row folded in commit order, so a
  // follower whose cursor is before it is refused rather than passed over the rows folded.
  `CREATE TABLE ledger_feed (folded_txid xid8 NOT NULL, folded_request_id text NOT NULL);
  INSERT INTO ledger_feed VALUES ('0', '');`,
  // 24: the requests each call sent to a paid upstream provider (as the embedded store's step 25), and their sum in
  // the folded totals; rows written before read 0 (a constant default: no rewrite of the table).
  `ALTER TABLE ledger ADD COLUMN upstream_requests integer NOT NULL DEFAULT 0;
  ALTER TABLE ledger_daily_totals ADD COLUMN upstream_requests bigint NOT NULL DEFAULT 0;`,
  // 25: the key QueryUsage's page tokens carry their sums under (core/usage-pages.ts), one for every replica, so a
  // page another replica answers shows the sums the first page read instead of reading the range again (the
  // embedded store's step 26): two of gen_random_uuid(), 122 random bits each from the server's strong source.
  `CREATE TABLE page_keys (name text PRIMARY KEY, key bytea NOT NULL CHECK (length(key) = 32));
  INSERT INTO page_keys (name, key) VALUES ('usage-sums', uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));`,
  // 26: an arrival time further ahead of the deciding replica's clock than one burst and one interval, which no call
  // on that clock could leave (its clock stepped back, or another replica's runs ahead), is read as the burst spent
  // up to now, as core/call-rate.ts rateTake reads it, rather than refusing the account for the whole difference.
  // Step 15's body otherwise; replicas of the previous version call the same function.
  admitWithRateBounded,
  // 27: leases and idempotency keys' holds expire on PostgreSQL's clock (gw_clock_ms), whichever replica writes or
  // reads them, rather than on the clock of the replica that wrote or read each. A replica whose clock ran ahead of
  // another's by more than a lease (15 s) took the other's live leases and holds as lapsed: it freed an account's
  // places and took an idempotency key still held, so a call was let past its concurrency, daily maximum or balance,
  // or run and charged twice; one behind renewed its own into the past. Each function is its previous body otherwise,
  // and the replica's renewals and its pruning of lapsed holds use the same clock.
  `CREATE FUNCTION gw_clock_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;
  ${admitOnDatabaseClock}
  ${replaceEach(claimKeyOnReplicaClock, [
    ["CREATE FUNCTION gw_claim_key(", "CREATE OR REPLACE FUNCTION gw_claim_key("],
    ["VALUES (p_account, p_key, p_fingerprint, p_token, p_now + p_hold_ms, NULL, p_now)", "VALUES (p_account, p_key, p_fingerprint, p_token, gw_clock_ms() + p_hold_ms, NULL, p_now)"],
    ["WHERE (t.request_id IS NULL AND t.expires_at <= p_now)", "WHERE (t.request_id IS NULL AND t.expires_at <= gw_clock_ms())"],
  ])}`,
  // 28: an arrival time ahead of the deciding replica's clock by up to 5 s more than one burst and one interval is
  // taken as it is (core/call-rate.ts rateSkewNs): replicas' calls reach this statement in another order than they
  // read their clocks, and step 26 read any such time as a step back, letting one call more through than the burst
  // each time (26 for a burst of 25 across three replicas). Step 27's body otherwise.
  replaceOnce(admitOnDatabaseClock, "IF tat - now_ns > p_rate_tolerance + p_rate_interval THEN", `IF tat - now_ns > p_rate_tolerance + p_rate_interval + ${rateSkewNs} THEN`),
];

/** `text` with each edit's text, found exactly once, replaced (replaceOnce). */
function replaceEach(text: string, edits: readonly (readonly [string, string])[]): string {
  return edits.reduce((t, [what, by]) => replaceOnce(t, what, by), text);
}

/** `text` with its one `what` replaced by `by`; throws if `what` is not there exactly once. */
function replaceOnce(text: string, what: string, by: string): string {
  const parts = text.split(what);
  if (parts.length !== 2) throw new Error(`a schema step's edit matches ${parts.length - 1} times, not once`);
  return parts.join(by);
}

/** What a call is told when the shared database does not answer. */
export const databaseUnreachable = "the shared database (PostgreSQL) cannot be reached, so calls are refused, and not charged, until it answers";

/** A failure to reach the shared database, as the 4000 every call that meets it answers. */
export function databaseFault(cause: unknown): GatewayError {
  return new GatewayError(ErrorCode.SERVER_INTERNAL_ERROR, databaseUnreachable, { cause });
}

/** Any lock id will do, as long as every gateway uses the same one. */
const schemaLock = 0x67617465; // "gate"

/**
 * How long a statement a call waits for may take: an admission, an
 * idempotency key's claim, a ledger commit, an account's or an item's read,
 * a sign's check. A connection that stops answering (a server that froze, a
 * failover, a link or a middlebox that drops packets) would otherwise hold
 * its statement, and every call behind it, until TCP gives up: minutes, or
 * never on a connection with nothing left to send. Past the bound the
 * statement fails, its connection is closed rather than reused, and its
 * calls answer 4000, like calls that meet an unreachable server.
 */
export const callStatementMs = 5000;

/**
 * The bound of every other statement (usage reports and listings, the
 * ledger's feed, account changes, top-ups, a catalogue import's batches, a
 * vacuum): long enough for a report over a large ledger, short enough that
 * nothing waits on a silent connection for ever. Schema steps, copies and
 * retention's folding are bounded by `bulkStatementMs` instead.
 */
export const backstopStatementMs = 300_000;

/**
 * The bound of work that grows with the data and that no caller waits for:
 * a schema step (and the wait for another replica's), the embedded store's
 * copy, retention's folding of a large ledger.
 */
export const bulkStatementMs = 3_600_000;

/** A statement with its own bound (node-postgres's `query_timeout`, which its published types leave out). */
export function bounded<I extends unknown[] = unknown[]>(ms: number, text: string, values?: I, name?: string): pg.QueryConfig<I> {
  return { text, values, name, query_timeout: ms } as pg.QueryConfig<I>;
}

/** A statement a call waits for: bounded by `callStatementMs`. */
export function callStatement<I extends unknown[] = unknown[]>(text: string, values?: I, name?: string): pg.QueryConfig<I> {
  return bounded(callStatementMs, text, values, name);
}

/**
 * This machine's clock less PostgreSQL's (`clock_timestamp()`), in ms: the
 * server's time is read by one query on a connection already held, and
 * compared with this clock at the middle of its round trip, so it is known
 * to within half the trip (`withinMs`). Leases and idempotency holds are on
 * PostgreSQL's clock (schema step 27); the rate limit, each call's day and
 * signed calls' windows are on the replica's, so replicas should agree.
 */
export async function clockOffset(pool: pg.Pool, now: () => number): Promise<{ readonly offsetMs: number; readonly withinMs: number }> {
  const client = await pool.connect();
  try {
    const started = performance.now();
    const wall = now();
    const { rows } = await client.query<{ ms: string }>(callStatement("SELECT ((extract(epoch FROM clock_timestamp()) * 1000)::bigint)::text AS ms"));
    const half = (performance.now() - started) / 2;
    return { offsetMs: wall + half - Number(rows[0]!.ms), withinMs: half };
  } finally {
    client.release();
  }
}

/**
 * A pool on the shared database; bigint columns come back as bigint, not
 * text. Every statement is bounded (`backstopStatementMs` unless it says
 * otherwise), and so is the wait for a connection. TCP keepalive starts
 * after 10 s of quiet, so a connection whose server went away while it was
 * idle is found dead by probes rather than by the next statement.
 */
export function openPostgres(url: string, options: { max?: number } = {}): pg.Pool {
  const pool = new pg.Pool({
    connectionString: url,
    max: options.max ?? 10,
    connectionTimeoutMillis: 5000,
    query_timeout: backstopStatementMs,
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
  });
  // A pool's idle client can fail (the server restarted); the next query reconnects, so say nothing here.
  pool.on("error", () => {});
  // node-postgres reports a checked-out client's lost connection twice: its statement fails, and the client emits
  // `error`, which with no listener ends the process (the pool listens only while a client is idle). The statement's
  // failure is what its caller acts on, so every client's event is heard once, for its whole life.
  pool.on("connect", (client) => client.on("error", () => {}));
  return pool;
}

/**
 * Brings the database's schema up to date: each missing step in one
 * transaction, under a transaction-scoped advisory lock, so replicas that
 * start at once apply each step once and the rest find it done. Returns the
 * version it found and the one it left.
 */
export async function migrateSchema(pool: pg.Pool): Promise<{ from: number; to: number }> {
  return inTransaction(pool, async (client) => {
    // Another replica's schema steps may hold the lock for as long as they take.
    await client.query(bounded(bulkStatementMs, "SELECT pg_advisory_xact_lock($1)", [schemaLock]));
    await client.query("CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
    const { rows } = await client.query<{ v: number | null }>("SELECT max(version) AS v FROM schema_migrations");
    const from = rows[0]?.v ?? 0;
    for (let v = from; v < migrations.length; v++) {
      await client.query(bounded(bulkStatementMs, migrations[v]!));
      await client.query("INSERT INTO schema_migrations (version) VALUES ($1)", [v + 1]);
    }
    return { from, to: Math.max(from, migrations.length) };
  });
}

/**
 * Runs `work` on one client in one transaction (`begin` opens it): committed
 * when `work` returns, rolled back when it throws (the error is thrown on).
 * The client goes back to the pool when the transaction ended, committed or
 * rolled back; when even the rollback fails (a statement timed out, the
 * connection was lost) it is closed instead, which ends whatever the
 * session still held, rather than handed to the next caller in a state
 * nobody knows.
 */
export async function inTransaction<T>(pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>, begin = "BEGIN"): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query(begin);
    const result = await work(client);
    await client.query("COMMIT");
    return result;
  } catch (e) {
    await client.query("ROLLBACK").catch((r: unknown) => (broken = r instanceof Error ? r : new Error(String(r))));
    throw e;
  } finally {
    client.release(broken);
  }
}
