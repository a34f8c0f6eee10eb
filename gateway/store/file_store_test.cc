#include "gateway/store/file_store.h"

#include <gtest/gtest.h>

#include "gateway/store/store_test_fixture.h"

namespace ferry::gateway::store {
namespace {

namespace testbed = ferry::sql::testbed;
using testing::StoreTest;

template <typename Backend>
class FileStoreTest : public StoreTest<Backend> {};
TYPED_TEST_SUITE(FileStoreTest, testbed::Backends, testbed::BackendNames);

StoreErrorKind KindOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const StoreError& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no StoreError";
  return StoreErrorKind::kInvalid;
}

TYPED_TEST(FileStoreTest, CreateGetContentDelete) {
  FileStore files(this->db(), {});
  std::string bytes("a\0b\xff\n", 5);
  FileObject f = files.Create("t1", "batch", "in.jsonl", bytes, 1000.7);
  EXPECT_EQ(f.id.substr(0, 5), "file-");
  EXPECT_EQ(f.id.size(), 5u + 24u);
  EXPECT_EQ(f.bytes, 5);
  EXPECT_EQ(f.created_at, 1000);
  EXPECT_EQ(f.ToJson().dump(), "{\"bytes\":5,\"created_at\":1000,\"filename\":\"in.jsonl\",\"id\":\"" + f.id +
                                   "\",\"object\":\"file\",\"purpose\":\"batch\",\"status\":\"processed\"}");
  auto got = files.Get("t1", f.id);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->filename, "in.jsonl");
  EXPECT_EQ(files.Content("t1", f.id), bytes);
  EXPECT_TRUE(files.Delete("t1", f.id));
  EXPECT_FALSE(files.Delete("t1", f.id));
  EXPECT_FALSE(files.Get("t1", f.id));
  EXPECT_EQ(KindOf([&] { files.Content("t1", f.id); }), StoreErrorKind::kNotFound);
  EXPECT_EQ(KindOf([&] { files.Create("t1", "", "x", "", 1); }), StoreErrorKind::kInvalid);
}

TYPED_TEST(FileStoreTest, ListPaginatesBothOrdersAndFiltersPurpose) {
  FileStore files(this->db(), {});
  std::vector<std::string> ids;  // creation order; two share a second to exercise the id tie-break
  for (int i = 0; i < 5; ++i) ids.push_back(files.Create("t1", i == 2 ? "fine-tune" : "batch", "f", "x", 100 + i / 2 * 1.0).id);
  files.Create("t2", "batch", "other", "x", 100);
  std::vector<std::string> seen;
  FileListOptions opt{.limit = 2, .order = SortOrder::kAsc};
  for (;;) {
    FilePage page = files.List("t1", opt);
    for (const auto& f : page.data) seen.push_back(f.id);
    if (!page.has_more) break;
    opt.after = page.data.back().id;
  }
  ASSERT_EQ(seen.size(), 5u);
  std::vector<std::string> desc;
  opt = FileListOptions{.limit = 3, .order = SortOrder::kDesc};
  for (;;) {
    FilePage page = files.List("t1", opt);
    for (const auto& f : page.data) desc.push_back(f.id);
    if (!page.has_more) break;
    opt.after = page.data.back().id;
  }
  EXPECT_EQ(std::vector<std::string>(seen.rbegin(), seen.rend()), desc);
  std::sort(seen.begin(), seen.end());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(seen, ids);
  FilePage batch_only = files.List("t1", {.purpose = "batch"});
  EXPECT_EQ(batch_only.data.size(), 4u);
  EXPECT_FALSE(batch_only.has_more);
  EXPECT_EQ(KindOf([&] { files.List("t1", {.limit = 0}); }), StoreErrorKind::kInvalid);
}

TYPED_TEST(FileStoreTest, LimitsNameFieldValueAndLimit) {
  FileStore files(this->db(), {.max_file_bytes = 10, .max_tenant_bytes = 15, .max_total_bytes = 25});
  try {
    files.Create("t1", "batch", "f", std::string(11, 'x'), 1);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreErrorKind::kTooLarge);
    EXPECT_STREQ(e.what(), "file: bytes 11 over max_file_bytes 10");
  }
  files.Create("t1", "batch", "f", std::string(10, 'x'), 1);
  try {
    files.Create("t1", "batch", "f", std::string(6, 'x'), 1);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreErrorKind::kFull);
    EXPECT_STREQ(e.what(), "file: bytes 6 over the tenant's max_tenant_bytes 15 (10 in use)");
  }
  files.Create("t2", "batch", "f", std::string(10, 'x'), 1);
  EXPECT_EQ(KindOf([&] { files.Create("t3", "batch", "f", std::string(6, 'x'), 1); }), StoreErrorKind::kFull);
  files.Create("t3", "batch", "f", std::string(5, 'x'), 1);
}

TYPED_TEST(FileStoreTest, AnotherTenantsIdAnswersAsUnknown) {
  FileStore files(this->db(), {});
  FileObject f = files.Create("t1", "batch", "f", "secret", 1);
  const std::string unknown = "file-000000000000000000000000";
  for (const std::string& id : {f.id, unknown}) {
    EXPECT_FALSE(files.Get("t2", id));
    EXPECT_EQ(KindOf([&] { files.Content("t2", id); }), StoreErrorKind::kNotFound);
    EXPECT_FALSE(files.Delete("t2", id));
    EXPECT_EQ(KindOf([&] { files.List("t2", {.after = id}); }), StoreErrorKind::kNotFound);
  }
  EXPECT_TRUE(files.List("t2", {}).data.empty());
  EXPECT_EQ(files.Content("t1", f.id), "secret");
}

TYPED_TEST(FileStoreTest, RetentionAndDeleteSpareUnfinishedBatchInput) {
  FileStore files(this->db(), {.retention_s = 100});
  FileObject old_file = files.Create("t1", "batch", "old", "x", 0);
  FileObject fresh = files.Create("t1", "batch", "fresh", "x", 150);
  BatchStore batches(this->db());
  BatchObject b = batches.Create("t1", fresh.id, "/v1/chat/completions", "24h", "", testing::ChatLines(1), 150);
  EXPECT_EQ(KindOf([&] { files.Delete("t1", fresh.id); }), StoreErrorKind::kConflict);
  EXPECT_EQ(files.Expire(1000), 1);  // old goes; fresh is an unfinished batch's input
  EXPECT_FALSE(files.Get("t1", old_file.id));
  EXPECT_TRUE(files.Get("t1", fresh.id));
  batches.Cancel("t1", b.id, 200);
  ASSERT_EQ(batches.FinalizeReady(200), 1);
  EXPECT_TRUE(files.Delete("t1", fresh.id));
  EXPECT_EQ(FileStore(this->db(), {}).Expire(1e9), 0);  // retention 0 keeps everything
}

}  // namespace
}  // namespace ferry::gateway::store
