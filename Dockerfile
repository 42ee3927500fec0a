# syntax=docker/dockerfile:1
# flowlog: the consumer daemon (entrypoint) and the producer, in one small
# image that runs as a non-root user.
#
#   docker build -t flowlog:dev .
#   docker run --rm flowlog:dev --help
#   docker run --rm --entrypoint /producer flowlog:dev --help

FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
# nodev leaves `consumer dev` and its embedded Kafka, GCS and Redis out.
RUN go build -tags nodev -ldflags="-s -w" -o /out/consumer ./cmd/consumer \
 && go build -ldflags="-s -w" -o /out/producer ./cmd/producer \
 && mkdir -p /out/var/lib/flowlog/temp

FROM alpine:3.22
# wget (busybox) serves the compose health check of /healthz.
RUN addgroup -S -g 10001 flowlog && adduser -S -D -H -u 10001 -G flowlog flowlog
COPY --from=build /out/consumer /out/producer /
COPY --from=build --chown=10001:10001 /out/var/lib/flowlog /var/lib/flowlog
USER 10001:10001
WORKDIR /var/lib/flowlog
# The HTTP surface listens on every interface so that Prometheus in another
# container can scrape /metrics. POST /flush is still only served to
# loopback clients (docker exec) unless FLOWLOG_ADMIN_TOKEN or
# FLOWLOG_ADMIN_TOKEN_FILE sets a bearer token.
ENV FLOWLOG_TEMP_DIR=/var/lib/flowlog/temp \
    FLOWLOG_HTTP_ADDR=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/consumer"]
CMD ["run"]
