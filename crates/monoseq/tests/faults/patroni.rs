//! A PostgreSQL primary and synchronous standby managed by Patroni and etcd.
