//! SQLite, PostgreSQL and MySQL/MariaDB stores for `idem`, each behind the cargo
//! feature of its name. The stores arrive with the issue that builds them; until then
//! this crate is empty.
