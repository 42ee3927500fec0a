// Package testenv starts the real services flowlog's tests run against: a
// private redis-server on a free loopback port, an Apache Kafka broker
// process (KRaft, one node, its jars fetched from Maven Central by
// kafka/pom.xml), an in-process kfake Kafka cluster (a real Kafka protocol
// server, for fast unit tests and fault injection) and an in-process
// fake-gcs-server. KafkaKind reads FLOWLOG_TEST_KAFKA, the switch between
// the two brokers for end-to-end tests.
//
// Every helper registers its own cleanup with t.Cleanup, so a test only asks
// for what it needs and never touches the machine's default ports.
package testenv
