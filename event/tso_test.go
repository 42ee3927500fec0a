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
