package event

import "time"

// logicalBits is the width of a TSO's logical part.
const logicalBits = 18

// ComposeTS builds a TSO timestamp: physical Unix milliseconds << 18 |
// logical. Logical bits beyond 18 are dropped.
func ComposeTS(physicalMillis int64, logical uint64) uint64 {
	return uint64(physicalMillis)<<logicalBits | logical&(1<<logicalBits-1)
}

// PhysicalTime returns the physical part of a TSO timestamp in UTC.
func PhysicalTime(ts uint64) time.Time {
	return time.UnixMilli(int64(ts >> logicalBits)).UTC()
}

// hours holds the two-digit hours so DateHour allocates only the date.
var hours = [24]string{
	"00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11",
	"12", "13", "14", "15", "16", "17", "18", "19", "20", "21", "22", "23",
}

// DateHour returns the UTC date ("20060102") and hour ("15") of a TSO
// timestamp's physical part, as used in object paths (docs/FORMAT.md,
// "Bucket layout").
func DateHour(ts uint64) (date, hour string) {
	t := PhysicalTime(ts)
	y, m, d := t.Date()
	var b [8]byte
	if y < 0 || y > 9999 {
		y = 9999 // unreachable for a 46-bit physical part; keeps 8 digits
	}
	b[0] = byte('0' + y/1000)
	b[1] = byte('0' + y/100%10)
	b[2] = byte('0' + y/10%10)
	b[3] = byte('0' + y%10)
	b[4] = byte('0' + int(m)/10)
	b[5] = byte('0' + int(m)%10)
	b[6] = byte('0' + d/10)
	b[7] = byte('0' + d%10)
	return string(b[:]), hours[t.Hour()]
}

// MaxTS is the largest TSO a record may carry when the consumer's clock
// reads now and clocks may disagree by skew: the last TSO of the
// millisecond now+skew. A larger commit or resolved ts claims a time that
// has not come yet, by more than any honest clock is off: a producer clock
// far ahead, a corrupted heartbeat, or an attack. The consumer refuses such
// records (docs/OPERATING.md, "Time is bounded"), so that no record can move
// the checkpoint, maxts or a coverage window into the future.
func MaxTS(now time.Time, skew time.Duration) uint64 {
	ms := now.Add(skew).UnixMilli()
	if ms <= 0 {
		return 0
	}
	if ms >= 1<<(64-logicalBits) {
		return ^uint64(0)
	}
	return ComposeTS(ms, 1<<logicalBits-1)
}

// Ahead is how far ts's physical time lies past now (saturating at the
// largest Duration), and 0 when it does not.
func Ahead(ts uint64, now time.Time) time.Duration {
	return max(PhysicalTime(ts).Sub(now), 0)
}
