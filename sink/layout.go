package sink

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/flowlog/flowlog/event"
)

// MetaVersion is the version of a layout v1 meta: one flow's share of a
// cycle. Layout v2 metas are MetaVersion2.
const MetaVersion = 1

// ValidName reports whether s may be used as a catalog or flow name in an
// object path: 1 to 128 characters of [A-Za-z0-9_-].
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
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

// FlowDir is the directory of a flow's objects: <prefix>/<catalog>/<flow>/v1
// (no leading slash when prefix is empty). catalog and flow must be valid
// names (see ValidName); callers validate them before building paths.
func FlowDir(prefix, catalog, flow string) string {
	d := catalog + "/" + flow + "/v1"
	if prefix != "" {
		d = strings.TrimSuffix(prefix, "/") + "/" + d
	}
	return d
}

// DataPath is the name of a data object:
// <prefix>/<catalog>/<flow>/v1/<YYYYMMDD>/<HH>/<min_ts>-<flow_id>-<cycle_id>.log,
// the date and hour being the UTC time of minTS's physical part. The flow id
// keeps a flow dropped and created again under the same name apart from the
// old one, even in one cycle (docs/FORMAT.md, "Bucket layout").
func DataPath(prefix, catalog, flow string, flowID uint32, minTS uint64, cycleID string) string {
	date, hour := event.DateHour(minTS)
	return FlowDir(prefix, catalog, flow) + "/" + date + "/" + hour + "/" + strconv.FormatUint(minTS, 10) + "-" +
		strconv.FormatUint(uint64(flowID), 10) + "-" + cycleID + ".log"
}

// MetaPath is the name of a meta object:
// <prefix>/<catalog>/<flow>/v1/backupmeta/<min_resolved_ts:020d>-<flow_id>-<cycle_id>.meta.
// The zero padding makes a flow's metas list in resolved-ts order.
func MetaPath(prefix, catalog, flow string, flowID uint32, minResolvedTS uint64, cycleID string) string {
	return fmt.Sprintf("%s/backupmeta/%020d-%d-%s.meta", FlowDir(prefix, catalog, flow), minResolvedTS, flowID, cycleID)
}

// CheckpointPath is the name of a flow's global checkpoint object for a
// consumer group: <prefix>/<catalog>/<flow>/v1/global_checkpoint/<group>-<flow_id>.ts.
// A dropped flow's object stays where it was when a new flow of the same
// name writes its own.
func CheckpointPath(prefix, catalog, flow, group string, flowID uint32) string {
	return FlowDir(prefix, catalog, flow) + "/global_checkpoint/" + group + "-" + strconv.FormatUint(uint64(flowID), 10) + ".ts"
}

// SplitFlowPath returns the catalog and flow of an object name built by the
// path functions above with the given prefix.
func SplitFlowPath(prefix, name string) (catalog, flow string, ok bool) {
	if prefix != "" {
		p := strings.TrimSuffix(prefix, "/") + "/"
		if !strings.HasPrefix(name, p) {
			return "", "", false
		}
		name = name[len(p):]
	}
	parts := strings.SplitN(name, "/", 4)
	if len(parts) < 4 || parts[2] != "v1" || !ValidName(parts[0]) || !ValidName(parts[1]) {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// Meta is the meta object of one flush cycle: it lists the chunks of the
// cycle's data object and the Kafka offsets they came from. A version 1
// meta is one flow's share of a cycle (Flow, FlowID; every file is the
// flow's). A version 2 meta is the whole cycle: Flows names every flow with
// a chunk or a coverage report in it, each file lists the flows that routed
// it (FileMeta.FlowIDs), and Partitions and Coverage are what the cycle's
// commit wrote to Redis, so that the bucket can rebuild Redis (consumer
// recover).
type Meta struct {
	Version int `json:"version"`
	// Flow and FlowID are the flow of a version 1 meta; absent in version 2.
	Flow    string `json:"flow,omitempty"`
	FlowID  uint32 `json:"flow_id,omitempty"`
	StoreID string `json:"store_id"`
	CycleID string `json:"cycle_id"`
	// Group is the consumer group that wrote a version 2 meta.
	Group         string        `json:"group,omitempty"`
	DataPath      string        `json:"data_path"`
	MinTS         uint64        `json:"min_ts"`
	MaxTS         uint64        `json:"max_ts"`
	MinResolvedTS uint64        `json:"min_resolved_ts"`
	Flows         []MetaFlow    `json:"flows,omitempty"`
	Offsets       []OffsetRange `json:"offsets"`
	// Partitions are the partition commits of a version 2 meta's cycle.
	Partitions []PartitionState `json:"partitions,omitempty"`
	// Coverage are the coverage reports a version 2 meta's commit made.
	Coverage []CoverageReport `json:"coverage,omitempty"`
	Files    []FileMeta       `json:"files"`
}

// MetaFlow is a flow a version 2 meta serves: its id and its catalog and
// name when the cycle was frozen. A flow with coverage reports and no chunk
// in the meta may have neither catalog nor name: one dropped before its
// writer started, whose drop recorded no definition.
type MetaFlow struct {
	FlowID  uint32 `json:"flow_id"`
	Catalog string `json:"catalog"`
	Name    string `json:"name"`
}

// PartitionState is what a cycle's commit wrote for one apply partition:
// offset:<topic>:<p> = NextOffset, ckpt:<topic>:<p> = Checkpoint (present
// when HasCheckpoint; "idle" when Idle), maxts:<topic>:<p> = MaxTS (when not
// 0) and regions:<topic>:<p> = Regions (region id in decimal -> last
// resolved ts).
type PartitionState struct {
	Topic         string            `json:"topic"`
	Partition     int32             `json:"partition"`
	NextOffset    int64             `json:"next_offset"`
	Checkpoint    uint64            `json:"ckpt,omitempty"`
	HasCheckpoint bool              `json:"has_ckpt,omitempty"`
	Idle          bool              `json:"idle,omitempty"`
	MaxTS         uint64            `json:"max_ts,omitempty"`
	Regions       map[string]uint64 `json:"regions,omitempty"`
}

// CoverageReport is one partition's report for a pending coverage step of
// a flow (coverage:<flow_id>:parts): its values at the routing boundary
// for the tables the step adds (Since) and removes (Until), and the last
// step the boundary crossed (Upto, at least Seq).
type CoverageReport struct {
	FlowID    uint32        `json:"flow_id"`
	Seq       uint64        `json:"seq"`
	Topic     string        `json:"topic"`
	Partition int32         `json:"partition"`
	Since     CoverageValue `json:"since"`
	Until     CoverageValue `json:"until"`
	Upto      uint64        `json:"upto"`
}

// CoverageValue is one bound of a coverage report: a ts, or Idle for a
// partition without a live region.
type CoverageValue struct {
	TS   uint64 `json:"ts,omitempty"`
	Idle bool   `json:"idle,omitempty"`
}

// Holds reports whether file f of m holds entries of flow id: every file of
// a version 1 meta of the flow, and the files of a version 2 meta whose
// FlowIDs name it.
func (m *Meta) Holds(id uint32, f *FileMeta) bool {
	if m.Version == MetaVersion {
		return m.FlowID == id
	}
	_, ok := slices.BinarySearch(f.FlowIDs, id)
	return ok
}

// Serves reports whether m has chunks of flow id.
func (m *Meta) Serves(id uint32) bool {
	if m.Version == MetaVersion {
		return m.FlowID == id
	}
	return slices.ContainsFunc(m.Flows, func(f MetaFlow) bool { return f.FlowID == id })
}

// OffsetRange is the half-open range [From, To) of offsets of one Kafka
// partition that a cycle consumed.
type OffsetRange struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
}

// Chunk compressions.
const (
	CompressionNone = "none"
	CompressionZstd = "zstd"
)

// Values of FileMeta.CF and FileMeta.Op.
const (
	CFDefault = "default"
	CFWrite   = "write"
	OpPut     = "put"
	OpDelete  = "delete"
)

// CFName is the FileMeta.CF value of a column family (lock-CF events are
// never stored).
func CFName(cf event.CF) string {
	if cf == event.CFWrite {
		return CFWrite
	}
	return CFDefault
}

// OpName is the FileMeta.Op value of an op.
func OpName(op event.Op) string {
	if op == event.OpDelete {
		return OpDelete
	}
	return OpPut
}

// FileMeta describes one chunk of a data object: one temp file's framed
// entries, stored at [Offset, Offset+Length) of the object.
type FileMeta struct {
	Offset                int64  `json:"offset"`
	Length                int64  `json:"length"`
	RawLength             int64  `json:"raw_length"`
	Compression           string `json:"compression"`
	SHA256                string `json:"sha256"` // hex, of the uncompressed framed bytes
	NumberOfEntries       int64  `json:"number_of_entries"`
	MinTS                 uint64 `json:"min_ts"`
	MaxTS                 uint64 `json:"max_ts"`
	ResolvedTS            uint64 `json:"resolved_ts"`
	MinBeginTSInDefaultCF uint64 `json:"min_begin_ts_in_default_cf"`
	StartKey              string `json:"start_key"` // hex of the smallest data key
	EndKey                string `json:"end_key"`   // hex of the largest data key
	TableID               int64  `json:"table_id"`
	// RegionID is the region that sent every entry of the chunk; 0 when
	// Regions is present.
	RegionID uint64 `json:"region_id"`
	// Regions are the runs of regions of a version 2 chunk that holds the
	// entries of several (docs/FORMAT.md, "Meta objects, version 2"): in
	// entry order, each run the region of that many consecutive entries.
	// Absent for a chunk of one region. Use EachRegion to read either.
	Regions   RegionRuns `json:"regions,omitempty"`
	CF        string     `json:"cf"` // "default" or "write"
	Op        string     `json:"op"` // "put" or "delete"
	IsMeta    bool       `json:"is_meta"`
	Partition int32      `json:"partition"`
	// FlowIDs are the flows that routed the chunk's entries, ascending
	// (version 2 only): a table several flows cover is stored once.
	FlowIDs []uint32 `json:"flow_ids,omitempty"`

	runs RegionRunSource // Regions while the entry is encoded (SetRegionRuns)
}

// EncodeMeta returns m as JSON, after checking it as DecodeMeta does.
func EncodeMeta(m Meta) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if m.Offsets == nil {
		m.Offsets = []OffsetRange{}
	}
	if m.Files == nil {
		m.Files = []FileMeta{}
	}
	b, err := encodeMetaJSON(m)
	if err != nil {
		return nil, fmt.Errorf("encode meta: %w", err)
	}
	return b, nil
}

// DecodeMeta parses a meta object and checks its version and consistency.
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("decode meta: %w", err)
	}
	if err := m.Validate(); err != nil {
		return Meta{}, err
	}
	return m, nil
}

// Bounds of a meta's lists. A cycle's files are bounded by
// --max-cycle-files (default 10,000; fetching pauses at twice as many, and
// --max-memory caps the flag at a sixth of it over 2 KiB per file), so a
// real meta stays far below maxMetaFiles; its offsets and partitions are
// one per apply partition, its flows one per flow of the cycle, its
// coverage reports one per partition and pending entry. A tampered meta is
// refused before its lists are used.
const (
	maxMetaFiles      = 1 << 20
	maxMetaFlows      = 1 << 16
	maxMetaPartitions = 1 << 16
	maxMetaCoverage   = 1 << 20
)

// Validate checks that m is a version 1 or 2 meta whose fields are
// consistent: valid names, known enum values, hex checksums and keys,
// chunks that do not overlap, half-open offset ranges, and for version 2
// flow ids that the meta's flows name, in ascending order.
func (m *Meta) Validate() error {
	errs := m.validateHeader(len(m.Files))
	if len(m.Files) > maxMetaFiles {
		return fmt.Errorf("invalid meta: %w", errors.Join(errs...))
	}
	fc := m.fileChecker()
	for i := range m.Files {
		if err := fc.check(i, &m.Files[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid meta: %w", err)
	}
	return nil
}

// validateHeader checks everything of m but its files, of which there are
// nFiles (m.Files is not looked at, so that a reader that streams the files
// checks the rest with the same rules).
func (m *Meta) validateHeader(nFiles int) []error {
	var errs []error
	switch m.Version {
	case MetaVersion:
		if !ValidName(m.Flow) {
			errs = append(errs, fmt.Errorf("invalid flow name %q", m.Flow))
		}
		if len(m.Flows) > 0 || len(m.Partitions) > 0 || len(m.Coverage) > 0 {
			errs = append(errs, errors.New("version 1 meta with version 2 fields"))
		}
	case MetaVersion2:
		errs = append(errs, m.validateV2()...)
	default:
		errs = append(errs, fmt.Errorf("version %d, want %d or %d", m.Version, MetaVersion, MetaVersion2))
	}
	errs = append(errs, m.validateFileCount(nFiles)...)
	if len(m.Offsets) > maxMetaPartitions {
		errs = append(errs, fmt.Errorf("%d offset ranges, more than %d", len(m.Offsets), maxMetaPartitions))
	}
	for i, o := range m.Offsets {
		if o.From < 0 || o.From > o.To {
			errs = append(errs, fmt.Errorf("offsets[%d]: bad range [%d, %d) of %s/%d", i, o.From, o.To, o.Topic, o.Partition))
		}
	}
	return errs
}

// validateFileCount checks what depends on the number of files.
func (m *Meta) validateFileCount(nFiles int) []error {
	var errs []error
	if nFiles > maxMetaFiles {
		errs = append(errs, fmt.Errorf("%d files, more than the %d a cycle can hold", nFiles, maxMetaFiles))
	}
	if m.DataPath == "" && nFiles > 0 {
		errs = append(errs, errors.New("files without data_path"))
	}
	if m.MinTS > m.MaxTS && nFiles > 0 {
		errs = append(errs, fmt.Errorf("min_ts %d > max_ts %d", m.MinTS, m.MaxTS))
	}
	return errs
}

// fileChecker checks a meta's files one by one, in order.
type fileChecker struct {
	version int
	flows   map[uint32]bool // flow id -> named (a chunk may name it)
	end     int64           // of the previous chunk
}

func (m *Meta) fileChecker() *fileChecker {
	flows := make(map[uint32]bool, len(m.Flows))
	for _, f := range m.Flows {
		flows[f.FlowID] = !f.unnamed()
	}
	return &fileChecker{version: m.Version, flows: flows}
}

// check checks file i, the next one: its fields, its flow ids, and that it
// starts at or after the end of the one before.
func (c *fileChecker) check(i int, f *FileMeta) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("files[%d]: %w", i, err)
	}
	var errs []error
	if err := f.validateFlows(c.version, c.flows); err != nil {
		errs = append(errs, fmt.Errorf("files[%d]: %w", i, err))
	}
	if err := f.validateRegions(c.version); err != nil {
		errs = append(errs, fmt.Errorf("files[%d]: %w", i, err))
	}
	if f.Offset < c.end {
		errs = append(errs, fmt.Errorf("files[%d]: offset %d overlaps the previous chunk ending at %d", i, f.Offset, c.end))
	}
	c.end = f.Offset + f.Length
	return errors.Join(errs...)
}

// validateV2 checks the fields only a version 2 meta has.
func (m *Meta) validateV2() []error {
	var errs []error
	if m.Flow != "" || m.FlowID != 0 {
		errs = append(errs, errors.New("version 2 meta with a flow of its own"))
	}
	if !ValidName(m.StoreID) {
		errs = append(errs, fmt.Errorf("invalid store id %q", m.StoreID))
	}
	switch {
	case len(m.Flows) > maxMetaFlows:
		errs = append(errs, fmt.Errorf("%d flows, more than %d", len(m.Flows), maxMetaFlows))
	case len(m.Partitions) > maxMetaPartitions:
		errs = append(errs, fmt.Errorf("%d partitions, more than %d", len(m.Partitions), maxMetaPartitions))
	case len(m.Coverage) > maxMetaCoverage:
		errs = append(errs, fmt.Errorf("%d coverage reports, more than %d", len(m.Coverage), maxMetaCoverage))
	}
	seen := make(map[uint32]bool, len(m.Flows))
	for i := range m.Flows {
		if err := m.Flows[i].validate(i, seen); err != nil {
			errs = append(errs, err)
		}
	}
	for i := range m.Partitions {
		if err := m.Partitions[i].validate(i); err != nil {
			errs = append(errs, err)
		}
	}
	for i := range m.Coverage {
		if err := m.Coverage[i].validate(i, seen); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// validate checks flows[i] against the flow ids seen before it, and adds
// its own. A flow with neither catalog nor name is one with coverage
// reports and no chunk (dropped before its writer started, its drop having
// recorded no definition): fileChecker refuses a chunk of it.
func (f *MetaFlow) validate(i int, seen map[uint32]bool) error {
	defer func() { seen[f.FlowID] = true }()
	switch {
	case f.unnamed():
	case !ValidName(f.Catalog) || !ValidName(f.Name):
		return fmt.Errorf("flows[%d]: invalid flow %q/%q", i, f.Catalog, f.Name)
	case seen[f.FlowID]:
		return fmt.Errorf("flows[%d]: flow id %d twice", i, f.FlowID)
	}
	return nil
}

func (f *MetaFlow) unnamed() bool { return f.Catalog == "" && f.Name == "" }

func (p *PartitionState) validate(i int) error {
	if p.NextOffset < 0 || p.Idle && p.HasCheckpoint {
		return fmt.Errorf("partitions[%d]: bad state of %s/%d", i, p.Topic, p.Partition)
	}
	return nil
}

// validate checks coverage[i] against the meta's flow ids.
func (r *CoverageReport) validate(i int, flows map[uint32]bool) error {
	if !flows[r.FlowID] {
		return fmt.Errorf("coverage[%d]: flow id %d is not among the meta's flows", i, r.FlowID)
	}
	return nil
}

// validateFlows checks a file's flow ids: none in a version 1 meta; in a
// version 2 meta at least one, ascending, each a flow of the meta.
func (f *FileMeta) validateFlows(version int, flows map[uint32]bool) error {
	if version == MetaVersion {
		if len(f.FlowIDs) > 0 {
			return errors.New("flow_ids in a version 1 meta")
		}
		return nil
	}
	if len(f.FlowIDs) == 0 {
		return errors.New("no flow_ids")
	}
	for i, id := range f.FlowIDs {
		if i > 0 && id <= f.FlowIDs[i-1] {
			return fmt.Errorf("flow_ids %v not ascending", f.FlowIDs)
		}
		named, ok := flows[id]
		switch {
		case !ok:
			return fmt.Errorf("flow id %d is not among the meta's flows", id)
		case !named:
			return fmt.Errorf("flow id %d has a chunk but no catalog and name among the meta's flows", id)
		}
	}
	return nil
}

func (f *FileMeta) validate() error {
	switch {
	case f.Offset < 0 || f.Length < 0 || f.RawLength < 0:
		return fmt.Errorf("negative offset/length %d/%d/%d", f.Offset, f.Length, f.RawLength)
	case f.Compression != CompressionNone && f.Compression != CompressionZstd:
		return fmt.Errorf("unknown compression %q", f.Compression)
	case f.Compression == CompressionNone && f.Length != f.RawLength:
		return fmt.Errorf("uncompressed chunk with length %d != raw_length %d", f.Length, f.RawLength)
	case f.CF != CFDefault && f.CF != CFWrite:
		return fmt.Errorf("unknown cf %q", f.CF)
	case f.Op != OpPut && f.Op != OpDelete:
		return fmt.Errorf("unknown op %q", f.Op)
	case !isHex(f.SHA256) || len(f.SHA256) != 64:
		return fmt.Errorf("bad sha256 %q", f.SHA256)
	case !isHex(f.StartKey) || !isHex(f.EndKey):
		return errors.New("start_key/end_key not lowercase hex")
	case f.NumberOfEntries < 0:
		return fmt.Errorf("negative number_of_entries %d", f.NumberOfEntries)
	case f.NumberOfEntries > f.RawLength/minEntrySize || f.NumberOfEntries == 0 && f.RawLength > 0:
		return fmt.Errorf("number_of_entries %d does not fit raw_length %d", f.NumberOfEntries, f.RawLength)
	}
	return f.checkSizes()
}

// minEntrySize is the framed size of an empty entry: two length prefixes.
const minEntrySize = 8

// maxZstdRatio bounds how much a zstd frame can expand: a block yields at
// most 128 KiB and takes at least 4 bytes (an RLE block), and the frame
// header adds bytes on the stored side only.
const maxZstdRatio = 128 << 10 / 4

// checkSizes rejects a raw_length its stored bytes cannot produce, so that a
// tampered meta is refused before anything is read or allocated.
func (f *FileMeta) checkSizes() error {
	if f.Compression == CompressionZstd && f.RawLength/maxZstdRatio > f.Length {
		return fmt.Errorf("raw_length %d is more than %d zstd bytes can hold (at most %dx)", f.RawLength, f.Length, maxZstdRatio)
	}
	return nil
}

// isHex reports whether s is lowercase hex of whole bytes. It allocates
// nothing: a meta of 10,000 chunks has 30,000 such fields to check.
func isHex(s string) bool {
	if len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !lowerHex[s[i]] { // a table: the digit-or-letter test mispredicts on random hex
			return false
		}
	}
	return true
}

// lowerHex holds the bytes isHex takes: 0-9 and a-f.
var lowerHex = func() (t [256]bool) {
	for _, c := range "0123456789abcdef" {
		t[c] = true
	}
	return t
}()

// EncodeCheckpoint returns the content of a global checkpoint object: ts as
// 8 bytes little-endian.
func EncodeCheckpoint(ts uint64) []byte {
	return binary.LittleEndian.AppendUint64(nil, ts)
}

// DecodeCheckpoint parses a global checkpoint object.
func DecodeCheckpoint(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("checkpoint object is %d bytes, want 8", len(b))
	}
	return binary.LittleEndian.Uint64(b), nil
}
