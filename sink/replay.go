package sink

import "context"

// StreamFlowMeta streams meta object path of flow f, as restore reads it:
// the meta must be the flow's (a meta of another flow, or one whose
// data_path lies outside the flow's objects, is refused) and valid. header,
// if not nil, sees the meta without its files (but with its offsets) before
// the first file; file sees each file that holds the flow's entries, with
// its index in the meta's files, in order. Memory stays that of one file
// entry, however many the meta lists.
func StreamFlowMeta(ctx context.Context, b Bucket, f Flow, path string, header func(m *Meta) error, file func(m *Meta, i int, fm *FileMeta) error) error {
	if err := f.validate(); err != nil {
		return err
	}
	_, err := streamFlowMeta(ctx, b, f, path, header, file)
	return err
}
