package gcs_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// uploadStart is one request that starts an object write (JSON API
// "insert": a multipart upload, or the first request of a resumable one).
type uploadStart struct {
	name, uploadType, kmsKey string
	hasKMS                   bool
}

// recordingProxy forwards every request to fake-gcs-server and records the
// requests that start an upload (not the chunks of a resumable one, which
// carry its upload_id). fake-gcs-server drops the KMS key (its
// objects have no kmsKeyName), so the key is checked where GCS reads it: the
// kmsKeyName query parameter of the insert request.
func recordingProxy(t *testing.T, srv *testenv.GCS) (endpoint string, starts func() []uploadStart) {
	t.Helper()
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []uploadStart
	rp := httputil.NewSingleHostReverseProxy(target)
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/upload/storage/v1/b/") && !q.Has("upload_id") {
			mu.Lock()
			got = append(got, uploadStart{name: q.Get("name"), uploadType: q.Get("uploadType"), kmsKey: q.Get("kmsKeyName"), hasKMS: q.Has("kmsKeyName")})
			mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p.URL, func() []uploadStart {
		mu.Lock()
		defer mu.Unlock()
		return append([]uploadStart(nil), got...)
	}
}

// TestKMSKeyOnEveryWrite: --gcs-kms-key reaches every object write, the
// single-request upload, the resumable upload of a large object and the
// checkpoint overwrite; without it no key is sent.
func TestKMSKeyOnEveryWrite(t *testing.T) {
	srv := testenv.StartGCS(t)
	const key = "projects/p-1/locations/europe-west1/keyRings/flowlog/cryptoKeys/backup"
	small := []byte("small object")
	large := bytes.Repeat([]byte{'x'}, 16<<20+1) // past the chunk size: resumable
	ckpt := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	obj := func(name string, body []byte) sink.Object {
		return sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}
	}
	for _, tc := range []struct{ name, key string }{{"with key", key}, {"without key", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint, starts := recordingProxy(t, srv)
			b, err := gcs.New(context.Background(), gcs.Config{Bucket: testenv.Bucket, Endpoint: endpoint, KMSKey: tc.key})
			if err != nil {
				t.Fatalf("new: %v", err)
			}
			t.Cleanup(func() { b.Close() })
			ctx := context.Background()
			pre := strings.ReplaceAll(tc.name, " ", "-") + "/"
			if err := b.Upload(ctx, obj(pre+"small", small)); err != nil {
				t.Fatalf("upload small: %v", err)
			}
			if err := b.Upload(ctx, obj(pre+"large", large)); err != nil {
				t.Fatalf("upload large: %v", err)
			}
			for i := range 2 { // create, then replace
				ckpt[0] = byte(i)
				if err := b.Overwrite(ctx, obj(pre+"ckpt", ckpt)); err != nil {
					t.Fatalf("overwrite %d: %v", i, err)
				}
			}
			want := map[string]string{pre + "small": "multipart", pre + "large": "resumable", pre + "ckpt": "multipart"}
			got := starts()
			if len(got) != 4 {
				t.Fatalf("upload requests %+v, want 4 (small, large, ckpt twice)", got)
			}
			for _, s := range got {
				if want[s.name] != s.uploadType {
					t.Errorf("upload of %q: uploadType %q, want %q", s.name, s.uploadType, want[s.name])
				}
				if s.kmsKey != tc.key || s.hasKMS != (tc.key != "") {
					t.Errorf("upload of %q: kmsKeyName %q (sent: %v), want %q", s.name, s.kmsKey, s.hasKMS, tc.key)
				}
			}
			// The writes went through: the bucket holds what was written.
			for name, body := range map[string][]byte{pre + "small": small, pre + "large": large, pre + "ckpt": ckpt} {
				o, err := srv.GetObject(testenv.Bucket, name)
				if err != nil {
					t.Fatalf("get %s: %v", name, err)
				}
				if !bytes.Equal(o.Content, body) {
					t.Errorf("%s: %d bytes stored, want the %d written", name, len(o.Content), len(body))
				}
			}
		})
	}
}
