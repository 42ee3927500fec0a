package event

import (
	"testing"
	"time"
)

func TestDateHour(t *testing.T) {
	tests := []struct {
		name       string
		ts         uint64
		date, hour string
	}{
		{"seed", 431656320867237891, "20220307", "07"},
		{"zero", 0, "19700101", "00"},
		{"composed", ComposeTS(time.Date(2031, 12, 31, 23, 59, 59, 999e6, time.UTC).UnixMilli(), 1<<18-1), "20311231", "23"},
		{"hour boundary", ComposeTS(time.Date(2024, 2, 29, 10, 0, 0, 0, time.UTC).UnixMilli(), 0), "20240229", "10"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			date, hour := DateHour(tc.ts)
			if date != tc.date || hour != tc.hour {
				t.Fatalf("DateHour(%d) = %s/%s, want %s/%s", tc.ts, date, hour, tc.date, tc.hour)
			}
			if want := PhysicalTime(tc.ts).Format("20060102/15"); date+"/"+hour != want {
				t.Fatalf("DateHour(%d) = %s/%s, time.Format gives %s", tc.ts, date, hour, want)
			}
		})
	}
}

func TestComposeTS(t *testing.T) {
	ms := time.Date(2022, 3, 7, 7, 0, 0, 0, time.UTC).UnixMilli()
	tests := []struct {
		name    string
		logical uint64
		want    uint64
	}{
		{"logical 0", 0, uint64(ms) << 18},
		{"logical 3", 3, uint64(ms)<<18 | 3},
		{"logical overflow dropped", 1<<18 | 5, uint64(ms)<<18 | 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := ComposeTS(ms, tc.logical)
			if ts != tc.want {
				t.Fatalf("ComposeTS = %d, want %d", ts, tc.want)
			}
			if got := PhysicalTime(ts); got.UnixMilli() != ms || got.Location() != time.UTC {
				t.Fatalf("PhysicalTime = %v, want %d ms UTC", got, ms)
			}
		})
	}
}

func TestMaxTS(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	bound := MaxTS(now, 5*time.Minute)
	tests := []struct {
		name string
		ts   uint64
		ok   bool
	}{
		{"now", ComposeTS(now.UnixMilli(), 0), true},
		{"last ts of the bound's millisecond", ComposeTS(now.Add(5*time.Minute).UnixMilli(), 1<<18-1), true},
		{"one millisecond past the skew", ComposeTS(now.Add(5*time.Minute+time.Millisecond).UnixMilli(), 0), false},
		{"2^63", 1 << 63, false},
		{"2^64-1", ^uint64(0), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.ts <= bound; got != tc.ok {
				t.Errorf("%d <= MaxTS = %v, want %v", tc.ts, got, tc.ok)
			}
		})
	}
	if got := Ahead(^uint64(0), now); got < 100*365*24*time.Hour {
		t.Errorf("Ahead(2^64-1) = %v, want the largest Duration", got)
	}
	if got := Ahead(ComposeTS(now.Add(-time.Hour).UnixMilli(), 0), now); got != 0 {
		t.Errorf("Ahead(an hour ago) = %v, want 0", got)
	}
	if got := Ahead(ComposeTS(now.Add(90*time.Second).UnixMilli(), 5), now); got != 90*time.Second {
		t.Errorf("Ahead(now+90s) = %v, want 1m30s", got)
	}
}
