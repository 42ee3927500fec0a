package cli_test

import (
	"strings"
	"testing"

	"github.com/flowlog/flowlog/internal/cli"
)

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want, problem string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", ""},
		{"redis://:s3cret@h:6379/0", "redis://:xxxxx@h:6379/0", ""},
		{"rediss://user:s3cret@h:6379/0?addr=h2:1", "rediss://user:xxxxx@h:6379/0?addr=h2:1", ""},
		{"redis://user@h:1", "redis://user@h:1", ""},
		{"redis://:se%zzcret@h:1/0", "redis://:xxxxx@h:1/0", `invalid URL escape "xxxxx"`},
		{"redis://u:p@ss w@h:1/0", "redis://u:xxxxx@h:1/0", "invalid userinfo"},
		{"redis://u:se%zz@h:x/0", "redis://u:xxxxx@h:x/0", `invalid port ":x" after host`},
		{"redis://h:port/0", "redis://h:port/0", `invalid port ":port" after host`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := cli.RedactURL(tc.in); got != tc.want {
				t.Errorf("RedactURL = %q, want %q", got, tc.want)
			}
			got := cli.URLProblem(tc.in)
			if (tc.problem == "") != (got == "") || !strings.Contains(got, tc.problem) {
				t.Errorf("URLProblem = %q, want %q", got, tc.problem)
			}
			for _, secret := range []string{"s3cret", "se%zz", "zzcret", "p@ss"} {
				if strings.Contains(cli.RedactURL(tc.in)+got, secret) {
					t.Errorf("%q leaks %q", cli.RedactURL(tc.in)+" / "+got, secret)
				}
			}
		})
	}
}

func TestCheckURL(t *testing.T) {
	if err := cli.CheckURL("--redis-url", "redis://:pw@h:1/0"); err != nil {
		t.Fatalf("CheckURL(valid) = %v", err)
	}
	err := cli.CheckURL("--redis-url", "redis://:pw%zz@h:1/0")
	want := `--redis-url redis://:xxxxx@h:1/0: not a valid URL: invalid URL escape "xxxxx"`
	if err == nil || err.Error() != want {
		t.Fatalf("CheckURL = %v, want %s", err, want)
	}
}
