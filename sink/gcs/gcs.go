// Package gcs is the Google Cloud Storage backend of sink.Bucket, using the
// official cloud.google.com/go/storage client. It works against real GCS and
// against emulators such as fake-gcs-server (--gcs-endpoint or the client's
// own STORAGE_EMULATOR_HOST).
package gcs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/auth/httptransport"
	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/flowlog/flowlog/sink"
)

// Config is the GCS part of the command line. Prefix is not applied by the
// Bucket: callers build full object names with it (sink.DataPath etc.).
type Config struct {
	Bucket   string
	Prefix   string
	Endpoint string // host:port or URL of an emulator; empty: real GCS or STORAGE_EMULATOR_HOST
	// KMSKey is the Cloud KMS key every object is written with (CMEK),
	// projects/P/locations/L/keyRings/R/cryptoKeys/K; empty: the bucket's
	// default encryption.
	KMSKey string
	// ChunkSize is the resumable-upload chunk of objects larger than it
	// (the client buffers one chunk per upload); smaller objects go up in
	// a single request. Not a flag: `consumer run` derives it from
	// --max-memory. Zero means 16 MiB.
	ChunkSize int64
	// RequestTimeout ends a request whose server makes no progress for
	// this long (stallTransport): no response within it after the request
	// was sent, no byte of a body moving. Zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
}

// DefaultRequestTimeout is --gcs-request-timeout's default: far above
// any answer GCS gives a healthy client, far below "never".
const DefaultRequestTimeout = 30 * time.Second

// RegisterFlags registers the GCS flags on f.
func (c *Config) RegisterFlags(f *flag.FlagSet) {
	f.StringVar(&c.Bucket, "gcs-bucket", "flowlog", "GCS bucket the backups are written to")
	f.StringVar(&c.Prefix, "gcs-prefix", "", "prefix of every object name (no leading or trailing slash)")
	f.StringVar(&c.Endpoint, "gcs-endpoint", "", "GCS emulator endpoint, host:port or URL, without authentication (default: real GCS, or STORAGE_EMULATOR_HOST if set)")
	f.StringVar(&c.KMSKey, "gcs-kms-key", "",
		"Cloud KMS key every object is written with (CMEK), projects/P/locations/L/keyRings/R/cryptoKeys/K (default: the bucket's default encryption)")
	f.DurationVar(&c.RequestTimeout, "gcs-request-timeout", DefaultRequestTimeout,
		"a GCS request fails (a failed attempt) when the server makes no progress for this long: no response after the request was sent, no byte of an upload or download moving")
}

// Validate reports every problem with c, one per line.
func (c *Config) Validate() error {
	var errs []error
	if c.Bucket == "" {
		errs = append(errs, errors.New("--gcs-bucket: must not be empty"))
	}
	if strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/") {
		errs = append(errs, fmt.Errorf("--gcs-prefix %q: must not start or end with '/'", c.Prefix))
	}
	for _, part := range strings.Split(c.Prefix, "/") {
		if c.Prefix != "" && (part == "" || part == "." || part == "..") {
			errs = append(errs, fmt.Errorf("--gcs-prefix %q: empty, '.' or '..' path element", c.Prefix))
			break
		}
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, errors.New("--gcs-request-timeout: must not be negative (0: the default)"))
	}
	if c.KMSKey != "" {
		if err := validateKMSKey(c.KMSKey); err != nil {
			errs = append(errs, fmt.Errorf("--gcs-kms-key %q: %w", c.KMSKey, err))
		}
	}
	return errors.Join(errs...)
}

// endpointURL turns "host:port" or a URL into the JSON API base URL.
func endpointURL(e string) string {
	if !strings.Contains(e, "://") {
		e = "http://" + e
	}
	e = strings.TrimSuffix(e, "/")
	if !strings.HasSuffix(e, "/storage/v1") {
		e += "/storage/v1"
	}
	return e + "/"
}

// defaultChunkSize is the resumable-upload chunk size when Config leaves it
// zero.
const defaultChunkSize = 16 << 20

// Bucket is a sink.Bucket on one GCS bucket.
type Bucket struct {
	client *storage.Client
	bkt    *storage.BucketHandle
	name   string
	kmsKey string
	chunk  int64
}

var (
	_ sink.Bucket = (*Bucket)(nil)
	_ sink.Lister = (*Bucket)(nil)
)

// New connects to the bucket cfg.Bucket. With cfg.Endpoint set it talks to
// that emulator without authentication; otherwise it uses the client's
// defaults (Application Default Credentials, or STORAGE_EMULATOR_HOST).
// Every request it makes is bounded by cfg.RequestTimeout of silence
// (stallTransport).
func New(ctx context.Context, cfg Config) (*Bucket, error) {
	hc, err := newHTTPClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("gcs client: %w", err)
	}
	opts := []option.ClientOption{option.WithHTTPClient(hc)}
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(endpointURL(cfg.Endpoint)), storage.WithJSONReads())
	}
	c, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcs client: %w", err)
	}
	chunk := cfg.ChunkSize
	if chunk <= 0 {
		chunk = defaultChunkSize
	}
	return &Bucket{client: c, bkt: c.Bucket(cfg.Bucket), name: cfg.Bucket, kmsKey: cfg.KMSKey, chunk: chunk}, nil
}

// newHTTPClient is the storage client's HTTP client: the transport the
// client would build itself (Application Default Credentials, none for an
// emulator), on a base transport whose every request is bounded by
// cfg.RequestTimeout of silence.
func newHTTPClient(cfg Config) (*http.Client, error) {
	timeout := cfg.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 100 // as the storage client's own transport
	// Idle connections close before a request could find one the server
	// dropped silently.
	base.IdleConnTimeout = min(base.IdleConnTimeout, timeout)
	base.HTTP2 = &http.HTTP2Config{SendPingTimeout: 31 * time.Second}
	noAuth := cfg.Endpoint != "" || os.Getenv("STORAGE_EMULATOR_HOST") != ""
	return httptransport.NewClient(&httptransport.Options{
		BaseRoundTripper:      &stallTransport{base: base, timeout: timeout},
		DisableAuthentication: noAuth,
		DetectOpts: &credentials.DetectOptions{
			Scopes: []string{storage.ScopeFullControl, "https://www.googleapis.com/auth/cloud-platform"},
		},
	})
}

// newWriter is the writer of every object flowlog writes (Upload and
// Overwrite): CRC32C sent for server-side validation, the KMS key set, and
// objects larger than the chunk size uploaded in chunks.
func (b *Bucket) newWriter(ctx context.Context, o *storage.ObjectHandle, obj sink.Object) *storage.Writer {
	w := o.NewWriter(ctx)
	w.CRC32C = obj.CRC32C
	w.SendCRC32C = true
	w.KMSKeyName = b.kmsKey
	w.ChunkSize = 0
	if obj.Size > b.chunk {
		w.ChunkSize = int(b.chunk)
	}
	return w
}

// Upload implements sink.Bucket.
func (b *Bucket) Upload(ctx context.Context, obj sink.Object) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // aborts the write on any early return
	w := b.newWriter(ctx, b.bkt.Object(obj.Name).If(storage.Conditions{DoesNotExist: true}), obj)
	n, err := io.Copy(w, obj.Body)
	if err != nil {
		cancel()
		_ = w.Close()
		return fmt.Errorf("upload gs://%s/%s: %w", b.name, obj.Name, err)
	}
	if n != obj.Size {
		cancel()
		_ = w.Close()
		return fmt.Errorf("upload gs://%s/%s: body is %d bytes, want %d", b.name, obj.Name, n, obj.Size)
	}
	if err := w.Close(); err != nil {
		if isStatus(err, http.StatusPreconditionFailed) {
			return fmt.Errorf("upload gs://%s/%s: %w", b.name, obj.Name, sink.ErrExists)
		}
		return fmt.Errorf("upload gs://%s/%s: %w", b.name, obj.Name, err)
	}
	return nil
}

func isStatus(err error, code int) bool {
	var g *googleapi.Error
	return errors.As(err, &g) && g.Code == code
}

func (b *Bucket) wrap(op, name string, err error) error {
	if errors.Is(err, storage.ErrBucketNotExist) {
		return fmt.Errorf("%s gs://%s/%s: %w", op, b.name, name, sink.ErrBucketNotExist)
	}
	if errors.Is(err, storage.ErrObjectNotExist) || isStatus(err, http.StatusNotFound) {
		return fmt.Errorf("%s gs://%s/%s: %w", op, b.name, name, sink.ErrNotExist)
	}
	return fmt.Errorf("%s gs://%s/%s: %w", op, b.name, name, err)
}

// Get implements sink.Bucket.
func (b *Bucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	r, err := b.bkt.Object(name).NewReader(ctx)
	if err != nil {
		return nil, b.wrap("get", name, err)
	}
	return r, nil
}

// GetRange implements sink.Bucket.
func (b *Bucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	if off < 0 || length < 0 {
		return nil, fmt.Errorf("get range gs://%s/%s: bad range %d+%d", b.name, name, off, length)
	}
	if length == 0 {
		// A zero length means "to the end" to the client; an empty range
		// only needs the object to exist.
		if _, err := b.Size(ctx, name); err != nil {
			return nil, err
		}
		return io.NopCloser(strings.NewReader("")), nil
	}
	r, err := b.bkt.Object(name).NewRangeReader(ctx, off, length)
	if err != nil {
		if isStatus(err, http.StatusRequestedRangeNotSatisfiable) {
			return io.NopCloser(strings.NewReader("")), nil
		}
		return nil, b.wrap("get range", name, err)
	}
	return r, nil
}

// Size implements sink.Bucket.
func (b *Bucket) Size(ctx context.Context, name string) (int64, error) {
	a, err := b.bkt.Object(name).Attrs(ctx)
	if err != nil {
		return 0, b.wrap("size", name, err)
	}
	return a.Size, nil
}

// Iter implements sink.Bucket. GCS lists in lexical order of names.
func (b *Bucket) Iter(ctx context.Context, prefix string, fn func(name string) error) error {
	return b.List(ctx, prefix, func(o sink.ObjectInfo) error { return fn(o.Name) })
}

// List implements sink.Lister: names, sizes and creation times, in
// lexical order of names.
func (b *Bucket) List(ctx context.Context, prefix string, fn func(sink.ObjectInfo) error) error {
	q := &storage.Query{Prefix: prefix}
	if err := q.SetAttrSelection([]string{"Name", "Size", "Created"}); err != nil {
		return fmt.Errorf("list gs://%s/%s: %w", b.name, prefix, err)
	}
	it := b.bkt.Objects(ctx, q)
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if errors.Is(err, storage.ErrBucketNotExist) {
			return fmt.Errorf("list gs://%s/%s: %w: %w", b.name, prefix, sink.ErrBucketNotExist, err)
		}
		if err != nil {
			return fmt.Errorf("list gs://%s/%s: %w", b.name, prefix, err)
		}
		if err := fn(sink.ObjectInfo{Name: a.Name, Size: a.Size, Created: a.Created}); err != nil {
			return err
		}
	}
}

// Delete implements sink.Bucket.
func (b *Bucket) Delete(ctx context.Context, name string) error {
	err := b.bkt.Object(name).Delete(ctx)
	if err != nil && !errors.Is(err, storage.ErrObjectNotExist) && !isStatus(err, http.StatusNotFound) {
		return fmt.Errorf("delete gs://%s/%s: %w", b.name, name, err)
	}
	return nil
}

// Close implements sink.Bucket.
func (b *Bucket) Close() error { return b.client.Close() }
