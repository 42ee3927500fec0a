package sink

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/flowlog/flowlog/event"
)

// Layout v2 (docs/FORMAT.md, "Layout v2"): one data object and one meta per
// flush cycle for every flow the cycle serves, a global checkpoint object,
// and a catalog object per flow written when what it says changes.
//
//	<prefix>/v2/log/<YYYYMMDD>/<HH>/<min_ts>-<store_id>-<cycle_id>.log
//	<prefix>/v2/meta/<min_resolved_ts:020d>-<store_id>-<cycle_id>.meta
//	<prefix>/v2/global_checkpoint/<group>.ts
//	<prefix>/<catalog>/<flow>/v1/catalog/<group>-<flow_id>-<rev:020d>.json
//
// A cycle's data and meta object share the part of their names after the
// first '-', <store_id>-<cycle_id>: that pairs them (gc judges them as one
// unit) whatever characters the store id holds. Metas list in
// min_resolved_ts order. The catalog is never overwritten: each change is
// a new revision, and the highest revision of a flow id is its catalog.

// MetaVersion2 is the version of a layout v2 meta.
const MetaVersion2 = 2

// v2Dir is <prefix>/v2 (no leading slash when prefix is empty).
func v2Dir(prefix string) string {
	if prefix == "" {
		return "v2"
	}
	return strings.TrimSuffix(prefix, "/") + "/v2"
}

// V2LogDir is the directory of layout v2 data objects, with a trailing
// slash.
func V2LogDir(prefix string) string { return v2Dir(prefix) + "/log/" }

// V2MetaDir is the directory of layout v2 metas, with a trailing slash:
// listing it yields every cycle's meta in min_resolved_ts order.
func V2MetaDir(prefix string) string { return v2Dir(prefix) + "/meta/" }

// DataPathV2 is the name of a cycle's data object: the UTC date and hour of
// minTS's physical part, then <min_ts>-<store_id>-<cycle_id>.log.
func DataPathV2(prefix, storeID string, minTS uint64, cycleID string) string {
	date, hour := event.DateHour(minTS)
	return V2LogDir(prefix) + date + "/" + hour + "/" + strconv.FormatUint(minTS, 10) + "-" + storeID + "-" + cycleID + ".log"
}

// MetaPathV2 is the name of a cycle's meta.
func MetaPathV2(prefix, storeID string, minResolvedTS uint64, cycleID string) string {
	return fmt.Sprintf("%s%020d-%s-%s.meta", V2MetaDir(prefix), minResolvedTS, storeID, cycleID)
}

// CheckpointPathV2 is the name of the global checkpoint object of a
// consumer group: 8 bytes, the group's checkpoint as a little-endian TSO
// (EncodeCheckpoint).
func CheckpointPathV2(prefix, group string) string {
	return v2Dir(prefix) + "/global_checkpoint/" + group + ".ts"
}

// CatalogDir is the directory of a flow name's catalog objects, with a
// trailing slash.
func CatalogDir(prefix, catalog, flow string) string {
	return FlowDir(prefix, catalog, flow) + "/catalog/"
}

// CatalogPath is the name of revision rev of flow id's catalog, written
// by consumer group group.
func CatalogPath(prefix, catalog, flow, group string, flowID uint32, rev uint64) string {
	return fmt.Sprintf("%s%s-%d-%020d.json", CatalogDir(prefix, catalog, flow), group, flowID, rev)
}

// ParseCatalogName reads the group, flow id and revision of a catalog
// object's base name (<group>-<flow_id>-<rev:020d>.json).
func ParseCatalogName(base string) (group string, flowID uint32, rev uint64, ok bool) {
	s, ok := strings.CutSuffix(base, ".json")
	if !ok {
		return "", 0, 0, false
	}
	i := strings.LastIndexByte(s, '-')
	if i < 0 || len(s)-i-1 != 20 {
		return "", 0, 0, false
	}
	rev, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil {
		return "", 0, 0, false
	}
	s = s[:i]
	j := strings.LastIndexByte(s, '-')
	if j <= 0 {
		return "", 0, 0, false
	}
	id, err := strconv.ParseUint(s[j+1:], 10, 32)
	if err != nil || strconv.FormatUint(id, 10) != s[j+1:] {
		return "", 0, 0, false
	}
	return s[:j], uint32(id), rev, true
}

// V2Unit returns the cycle a layout v2 data or meta object belongs to
// (<store_id>-<cycle_id>) and its kind (GCData or GCMeta), and false for any
// other name.
func V2Unit(prefix, name string) (unit, kind string, ok bool) {
	switch {
	case strings.HasPrefix(name, V2MetaDir(prefix)):
		base := strings.TrimPrefix(name, V2MetaDir(prefix))
		s, ok := strings.CutSuffix(base, ".meta")
		num, rest, cut := strings.Cut(s, "-")
		if !ok || !cut || len(num) != 20 || !isDigits(num) || !validUnit(rest) {
			return "", "", false
		}
		return rest, GCMeta, true
	case strings.HasPrefix(name, V2LogDir(prefix)):
		parts := strings.Split(strings.TrimPrefix(name, V2LogDir(prefix)), "/")
		if len(parts) != 3 || len(parts[0]) != 8 || len(parts[1]) != 2 || !isDigits(parts[0]) || !isDigits(parts[1]) {
			return "", "", false
		}
		s, ok := strings.CutSuffix(parts[2], ".log")
		num, rest, cut := strings.Cut(s, "-")
		if !ok || !cut || num == "" || !isDigits(num) || !validUnit(rest) {
			return "", "", false
		}
		return rest, GCData, true
	}
	return "", "", false
}

// validUnit accepts <store_id>-<cycle_id>: names of [A-Za-z0-9_-].
func validUnit(s string) bool {
	if len(s) > 256 || !strings.Contains(s, "-") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
