CREATE TABLE IF NOT EXISTS "idempotent_record" (
  biz_type VARCHAR(64) NOT NULL,
  idempotent_key VARCHAR(255) NOT NULL,
  status VARCHAR(16) NOT NULL,
  fence BIGINT NOT NULL,
  fingerprint VARCHAR(64),
  request_body TEXT,
  response_body TEXT,
  error_message TEXT,
  lease_until TIMESTAMPTZ,
  created_at TIMESTAMPTZ NOT NULL,
  completed_at TIMESTAMPTZ,
  expires_at TIMESTAMPTZ NOT NULL,
  steps TEXT,
  subject VARCHAR(64),
  replay_until TIMESTAMPTZ,
  tombstone VARCHAR(16),
  watched BOOLEAN,
  PRIMARY KEY (biz_type, idempotent_key)
);
CREATE INDEX IF NOT EXISTS "idempotent_record_expires_at" ON "idempotent_record" (expires_at);
CREATE INDEX IF NOT EXISTS "idempotent_record_subject" ON "idempotent_record" (subject) WHERE subject IS NOT NULL;
