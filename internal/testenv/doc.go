// Package testenv starts the real services flowlog's tests run against: a
// private redis-server on a free loopback port, an in-process kfake Kafka
// cluster (a real Kafka protocol server) and an in-process fake-gcs-server.
//
// Every helper registers its own cleanup with t.Cleanup, so a test only asks
// for what it needs and never touches the machine's default ports.
package testenv
