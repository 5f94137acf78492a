CREATE TABLE IF NOT EXISTS `idempotent_record` (
  biz_type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
  idempotent_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
  status VARCHAR(16) NOT NULL,
  fence BIGINT NOT NULL,
  fingerprint VARCHAR(64) NULL,
  request_body LONGTEXT NULL,
  response_body LONGTEXT NULL,
  error_message TEXT NULL,
  lease_until DATETIME(6) NULL,
  created_at DATETIME(6) NOT NULL,
  completed_at DATETIME(6) NULL,
  expires_at DATETIME(6) NOT NULL,
  steps LONGTEXT NULL,
  PRIMARY KEY (biz_type, idempotent_key),
  KEY `idempotent_record_expires_at` (expires_at),
  CONSTRAINT `idempotent_record_status` CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAIL'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
