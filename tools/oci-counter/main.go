// oci-counter packages ratelimit-counter as a container image with no
// container engine, using go-containerregistry, as oci-wasm packages the
// filter: FROM scratch, one layer holding the binary, the shared libraries
// it loads (as ldd lists them, at their paths), busybox with its sh and wget
// applets (for a container healthcheck: wget -q -O - http://127.0.0.1:PORT/readyz)
// and an empty /tmp; entrypoint /bin/ratelimit-counter, user 65532 (no
// root). Every byte is a function of those files and the flags (no time
// stamps, fixed tar headers, fixed gzip header), so two builds of the same
// files give the same digest.
//
//	oci-counter -binary FILE -busybox FILE -tag NAME:TAG -out DIR
//
// writes DIR/layout, an OCI image layout holding the image (`crane push
// DIR/layout REF` pushes it), and DIR/image.tar, the same image as `docker
// save` writes it, tagged NAME:TAG (`docker load -i DIR/image.tar`), and
// prints one JSON object: tag, digest, size (manifest + config + layer,
// bytes), layout, tar.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	entrypoint        = "/bin/ratelimit-counter"
	refNameAnnotation = "org.opencontainers.image.ref.name"
	nonRoot           = "65532:65532"
)

func main() {
	binary := flag.String("binary", "", "the ratelimit-counter binary (required)")
	busybox := flag.String("busybox", "/bin/busybox", "a static busybox, for sh and wget")
	tag := flag.String("tag", "", "the image's name and tag, NAME:TAG (required)")
	outDir := flag.String("out", "", "output directory, replaced (required)")
	flag.Parse()
	if *binary == "" || *tag == "" || *outDir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: oci-counter -binary FILE [-busybox FILE] -tag NAME:TAG -out DIR")
		os.Exit(2)
	}
	if err := run(*binary, *busybox, *tag, *outDir); err != nil {
		fmt.Fprintln(os.Stderr, "oci-counter:", err)
		os.Exit(1)
	}
}

// entry is one file of the layer: its path in the image, its bytes, its mode.
type entry struct {
	path string
	data []byte
	mode int64
	link string
}

// sharedLibraries: the absolute paths ldd lists for binary (none for a
// static one).
func sharedLibraries(binary string) ([]string, error) {
	out, err := exec.Command("ldd", binary).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", binary, err, out)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
		var p string
		switch {
		case len(fields) >= 3 && fields[1] == "=>":
			p = fields[2]
		case len(fields) >= 1:
			p = fields[0]
		}
		if strings.HasPrefix(p, "/") {
			libs = append(libs, p)
		}
	}
	return libs, nil
}

func fileEntry(src, dest string) (entry, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return entry{}, err
	}
	return entry{path: strings.TrimPrefix(dest, "/"), data: data, mode: 0o755}, nil
}

func entries(binary, busybox string) ([]entry, error) {
	var out []entry
	add := func(src, dest string) error {
		e, err := fileEntry(src, dest)
		if err != nil {
			return err
		}
		out = append(out, e)
		return nil
	}
	if err := add(binary, entrypoint); err != nil {
		return nil, err
	}
	libs, err := sharedLibraries(binary)
	if err != nil {
		return nil, err
	}
	for _, lib := range libs {
		if err := add(lib, lib); err != nil {
			return nil, err
		}
	}
	bbLibs, err := sharedLibraries(busybox)
	if err != nil {
		return nil, err
	}
	if len(bbLibs) != 0 {
		return nil, fmt.Errorf("%s is not static (busybox-static: make deps-docker)", busybox)
	}
	if err := add(busybox, "/bin/busybox"); err != nil {
		return nil, fmt.Errorf("%w (busybox-static: make deps-docker)", err)
	}
	for _, applet := range []string{"sh", "wget"} {
		out = append(out, entry{path: "bin/" + applet, link: "busybox", mode: 0o777})
	}
	return out, nil
}

// layerTar: the entries with their parent directories and /tmp, sorted,
// every header fixed.
func layerTar(files []entry) ([]byte, error) {
	dirs := map[string]bool{"tmp": true}
	for _, f := range files {
		for d := filepath.Dir(f.path); d != "." && d != "/"; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var all []entry
	for d := range dirs {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		all = append(all, entry{path: d + "/", mode: mode})
	}
	seen := map[string]bool{}
	for _, f := range files {
		if !seen[f.path] {
			seen[f.path] = true
			all = append(all, f)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].path < all[j].path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range all {
		hdr := &tar.Header{Name: e.path, Mode: e.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case strings.HasSuffix(e.path, "/"):
			hdr.Typeflag = tar.TypeDir
		case e.link != "":
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = e.link
		default:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func image(binary, busybox, tag string) (v1.Image, error) {
	files, err := entries(binary, busybox)
	if err != nil {
		return nil, err
	}
	tarBytes, err := layerTar(files)
	if err != nil {
		return nil, err
	}
	// A gzip header without name or time: the same input gives the same bytes.
	var gzBuf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gzBuf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarBytes); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	gz := gzBuf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer})
	if err != nil {
		return nil, err
	}
	version := tag[strings.LastIndex(tag, ":")+1:]
	// The config as Append left it (its rootfs names the layer's diff id:
	// docker load refuses an image without it), with ours set.
	base, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg := base.DeepCopy()
	cfg.Architecture = runtime.GOARCH
	cfg.OS = "linux"
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.History = nil
	cfg.Config = v1.Config{
		Entrypoint: []string{entrypoint},
		Env:        []string{"PATH=/bin"},
		User:       nonRoot,
		WorkingDir: "/",
		ExposedPorts: map[string]struct{}{
			"8081/tcp": {}, "8080/tcp": {},
		},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "ratelimit-counter",
			"org.opencontainers.image.version": version,
		},
	}
	return mutate.ConfigFile(img, cfg)
}

func run(binary, busybox, tag, outDir string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag %s: %w", tag, err)
	}
	img, err := image(binary, busybox, tag)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(outDir); err != nil {
		return err
	}
	dir := filepath.Join(outDir, "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: tag})); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	tarPath := filepath.Join(outDir, "image.tar")
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		return fmt.Errorf("%s: %w", tarPath, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return err
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"tag": tag, "digest": digest.String(), "size": size, "layout": dir, "tar": tarPath,
	})
}
