CREATE TABLE IF NOT EXISTS "idempotent_record" (
  biz_type TEXT NOT NULL,
  idempotent_key TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status = 'PROCESSING' OR status = 'SUCCESS' OR status = 'FAIL'),
  fence INTEGER NOT NULL,
  fingerprint TEXT,
  request_body TEXT,
  response_body TEXT,
  error_message TEXT,
  lease_until TEXT,
  created_at TEXT NOT NULL,
  completed_at TEXT,
  expires_at TEXT NOT NULL,
  steps TEXT,
  subject TEXT,
  replay_until TEXT,
  tombstone TEXT,
  PRIMARY KEY (biz_type, idempotent_key)
);
CREATE INDEX IF NOT EXISTS "idempotent_record_expires_at" ON "idempotent_record" (expires_at);
CREATE INDEX IF NOT EXISTS "idempotent_record_subject" ON "idempotent_record" (subject) WHERE subject IS NOT NULL;
